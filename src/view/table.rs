//! Pages of a Parquet file for the viewer: rows by position read from the row groups
//! that hold them (the footer says where), an order by one column (that column read
//! alone, long texts by a prefix) and a text filter ([`Search`]: pieces of the file scanned
//! by a thread per core, its first hits answered while the rest are still being looked for):
//! never the whole file in memory.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder, RowSelection};
use synth_core::data::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use synth_core::data::arrow::datatypes::{DataType, SchemaRef};

/// Bytes of a text value that take part in sorting.
const SORT_PREFIX: usize = 96;

/// A Parquet file's footer: its schema and where each row group starts.
#[derive(Clone)]
pub struct Table {
    pub path: PathBuf,
    meta: ArrowReaderMetadata,
    /// First row of each row group, then the row count.
    starts: Vec<u64>,
}

impl Table {
    /// Read the footer (a file being written has none yet: that is an error of this view).
    pub fn open(path: &Path) -> Result<Table> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // The page index (when the writer kept one) lets a page of rows skip the data pages
        // before it instead of decoding them.
        let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new()
            .with_offset_index_policy(parquet::file::metadata::PageIndexPolicy::Optional);
        let meta = ArrowReaderMetadata::load(&file, options).with_context(|| {
            format!("{}: not a readable Parquet file (still being written, or corrupt)", path.display())
        })?;
        let mut starts = vec![0u64];
        for rg in meta.metadata().row_groups() {
            starts.push(starts.last().unwrap() + rg.num_rows().max(0) as u64);
        }
        Ok(Table { path: path.to_path_buf(), meta, starts })
    }

    pub fn rows(&self) -> u64 {
        *self.starts.last().unwrap()
    }

    pub fn schema(&self) -> SchemaRef {
        self.meta.schema().clone()
    }

    fn builder(&self) -> Result<ParquetRecordBatchReaderBuilder<File>> {
        let file = File::open(&self.path).with_context(|| format!("opening {}", self.path.display()))?;
        Ok(ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.meta.clone()))
    }

    /// The rows at these positions, as JSON objects in the order asked.
    pub fn read_rows(&self, positions: &[u64]) -> Result<Vec<serde_json::Value>> {
        let mut sorted: Vec<(u64, usize)> = positions.iter().copied().zip(0..).collect();
        sorted.sort_unstable();
        let mut out: Vec<serde_json::Value> = vec![serde_json::Value::Null; positions.len()];
        let mut i = 0;
        while i < sorted.len() {
            let rg = self.starts.partition_point(|s| *s <= sorted[i].0) - 1;
            let (start, end) = (self.starts[rg], self.starts[rg + 1]);
            let mut j = i;
            let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
            while j < sorted.len() && sorted[j].0 < end {
                let local = (sorted[j].0 - start) as usize;
                match ranges.last_mut() {
                    Some(r) if r.end == local => r.end += 1,
                    Some(r) if r.end > local => {} // the same row asked twice
                    _ => ranges.push(local..local + 1),
                }
                j += 1;
            }
            let selection = RowSelection::from_consecutive_ranges(ranges.iter().cloned(), (end - start) as usize);
            let reader = self.builder()?.with_row_groups(vec![rg]).with_row_selection(selection).build()?;
            let mut rows = Vec::new();
            for batch in reader {
                let batch = batch.with_context(|| format!("reading {}", self.path.display()))?;
                rows.extend(batch_to_json(&batch)?);
            }
            // The selected rows come back in order, each once.
            let mut k = 0;
            let mut last: Option<u64> = None;
            for (pos, at) in &sorted[i..j] {
                if last != Some(*pos) {
                    if last.is_some() {
                        k += 1;
                    }
                    last = Some(*pos);
                }
                out[*at] = rows.get(k).cloned().unwrap_or_default();
            }
            i = j;
        }
        Ok(out)
    }

    /// Positions of all rows ordered by `column` (nulls last; ties by position).
    pub fn order_by(&self, column: &str, descending: bool) -> Result<Vec<u32>> {
        let schema = self.schema();
        let idx = schema.index_of(column).with_context(|| format!("no column \"{column}\""))?;
        let mask = ProjectionMask::roots(self.meta.parquet_schema(), [idx]);
        let reader = self.builder()?.with_projection(mask).build()?;
        let mut keys: Vec<(Key, u32)> = Vec::with_capacity(self.rows() as usize);
        for batch in reader {
            let batch = batch?;
            let base = keys.len() as u32;
            keys.extend(keys_of(batch.column(0))?.into_iter().zip(base..));
        }
        keys.sort_by(|a, b| {
            let o = a.0.cmp_nulls_last(&b.0, descending);
            o.then(a.1.cmp(&b.1))
        });
        Ok(keys.into_iter().map(|(_, p)| p).collect())
    }

    /// Positions in `range` of the rows where any column's text contains `needle_lower`
    /// (lower case): only the pages holding those rows are decoded.
    fn filter_range(&self, needle_lower: &str, range: std::ops::Range<u64>) -> Result<Vec<u32>> {
        let mut hits = Vec::new();
        let mut pos = range.start;
        while pos < range.end {
            let rg = self.starts.partition_point(|s| *s <= pos) - 1;
            let (start, end) = (self.starts[rg], self.starts[rg + 1]);
            let stop = end.min(range.end);
            let local = (pos - start) as usize..(stop - start) as usize;
            let selection = RowSelection::from_consecutive_ranges(std::iter::once(local), (end - start) as usize);
            let reader = self
                .builder()?
                .with_row_groups(vec![rg])
                .with_row_selection(selection)
                .with_batch_size(4096)
                .build()?;
            let mut base = pos as u32;
            for batch in reader {
                let batch = batch.with_context(|| format!("reading {}", self.path.display()))?;
                let mut matched = vec![false; batch.num_rows()];
                for col in batch.columns() {
                    for (m, hit) in matched.iter_mut().zip(matches(col.as_ref(), needle_lower)?) {
                        *m |= hit;
                    }
                }
                hits.extend(matched.iter().enumerate().filter(|(_, m)| **m).map(|(r, _)| base + r as u32));
                base += batch.num_rows() as u32;
            }
            pos = stop;
        }
        Ok(hits)
    }

    /// Rows whose `column` (a text column) equals `value`.
    pub fn find(&self, column: &str, value: &str) -> Result<Vec<u64>> {
        let schema = self.schema();
        let Ok(idx) = schema.index_of(column) else { return Ok(Vec::new()) };
        if !matches!(schema.field(idx).data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
            return Ok(Vec::new());
        }
        let mask = ProjectionMask::roots(self.meta.parquet_schema(), [idx]);
        let reader = self.builder()?.with_projection(mask).build()?;
        let mut base = 0u64;
        let mut out = Vec::new();
        for batch in reader {
            let batch = batch?;
            let col = synth_core::data::arrow::compute::cast(batch.column(0), &DataType::Utf8)?;
            let s = col.as_string::<i32>();
            for r in 0..s.len() {
                if s.is_valid(r) && s.value(r) == value {
                    out.push(base + r as u64);
                }
            }
            base += batch.num_rows() as u64;
        }
        Ok(out)
    }
}

/// Rows a scanning thread takes at a time.
const SCAN_PIECE: u64 = 65_536;

/// A text filter over a table (every column's text, any case), scanned in pieces of
/// [`SCAN_PIECE`] rows by one thread per core; the hits of the pieces finished in file order
/// are known while later pieces are still scanned.
pub struct Search {
    rows: u64,
    found: Mutex<Found>,
    progress: Condvar,
}

struct Found {
    /// Hits of each piece finished out of order (taken once the pieces before it are done).
    pieces: Vec<Option<Vec<u32>>>,
    /// Pieces handed to a thread so far.
    next: usize,
    /// Pieces done in order, from the first.
    done: usize,
    /// The hits of those pieces, in position order.
    hits: Vec<u32>,
    error: Option<String>,
}

/// Where a search stands: the positions of one page of its hits and how many are known.
#[derive(Debug)]
pub struct Progress {
    pub positions: Vec<u32>,
    /// Hits known (all of them when `complete`).
    pub matched: u64,
    pub complete: bool,
    /// Rows searched from the start of the file.
    pub scanned: u64,
}

impl Search {
    /// Start scanning `table` for `needle` (threads that end when the file is scanned).
    pub fn start(table: &Table, needle: &str) -> Arc<Search> {
        let rows = table.rows();
        let pieces = rows.div_ceil(SCAN_PIECE) as usize;
        let search = Arc::new(Search {
            rows,
            found: Mutex::new(Found { pieces: vec![None; pieces], next: 0, done: 0, hits: Vec::new(), error: None }),
            progress: Condvar::new(),
        });
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).min(pieces);
        let needle = needle.to_lowercase();
        for _ in 0..threads {
            let (search, table, needle) = (search.clone(), table.clone(), needle.clone());
            std::thread::Builder::new()
                .name("synth-view-search".into())
                .spawn(move || search.work(&table, &needle))
                .expect("spawning a search thread");
        }
        search
    }

    fn work(&self, table: &Table, needle: &str) {
        loop {
            let k = {
                let mut f = self.found.lock().expect("search");
                if f.error.is_some() || f.next >= f.pieces.len() {
                    return;
                }
                f.next += 1;
                f.next - 1
            };
            let range = k as u64 * SCAN_PIECE..((k as u64 + 1) * SCAN_PIECE).min(self.rows);
            let result = table.filter_range(needle, range);
            let mut f = self.found.lock().expect("search");
            match result {
                Ok(hits) => {
                    f.pieces[k] = Some(hits);
                    let f = &mut *f;
                    while let Some(hits) = f.pieces.get_mut(f.done).and_then(Option::take) {
                        f.hits.extend(hits);
                        f.done += 1;
                    }
                }
                Err(e) => f.error = Some(format!("{e:#}")),
            }
            drop(f);
            self.progress.notify_all();
        }
    }

    /// Hits `offset..offset + limit` once they are known, or what is known when the search
    /// has gone on for `patience` (`None`: until it ends).
    pub fn page(&self, offset: usize, limit: usize, patience: Option<Duration>) -> Result<Progress> {
        let deadline = patience.map(|p| Instant::now() + p);
        let mut f = self.found.lock().expect("search");
        loop {
            if let Some(e) = &f.error {
                anyhow::bail!("{e}");
            }
            let complete = f.done == f.pieces.len();
            let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
            if complete || f.hits.len() >= offset + limit || timed_out {
                return Ok(Progress {
                    positions: f.hits.iter().skip(offset).take(limit).copied().collect(),
                    matched: f.hits.len() as u64,
                    complete,
                    scanned: (f.done as u64 * SCAN_PIECE).min(self.rows),
                });
            }
            f = match deadline {
                Some(d) => {
                    self.progress.wait_timeout(f, d.saturating_duration_since(Instant::now())).expect("search").0
                }
                None => self.progress.wait(f).expect("search"),
            };
        }
    }

    /// Every hit, once the search has ended.
    pub fn all(&self) -> Result<Vec<u32>> {
        let mut f = self.found.lock().expect("search");
        loop {
            if let Some(e) = &f.error {
                anyhow::bail!("{e}");
            }
            if f.done == f.pieces.len() {
                return Ok(f.hits.clone());
            }
            f = self.progress.wait(f).expect("search");
        }
    }

    /// Whether more than one piece is scanned (a small table is answered whole).
    pub fn is_big(&self) -> bool {
        self.rows > SCAN_PIECE
    }
}

/// Whether `hay` contains `needle_lower` (already lower case) in any case.
fn contains_lower(hay: &str, needle_lower: &str) -> bool {
    let n = needle_lower.as_bytes();
    if n.is_empty() {
        return true;
    }
    if needle_lower.is_ascii() {
        // Candidates where the first byte matches in either case, then the rest.
        let h = hay.as_bytes();
        return memchr::memchr2_iter(n[0], n[0].to_ascii_uppercase(), h)
            .any(|i| h.len() - i >= n.len() && h[i..i + n.len()].eq_ignore_ascii_case(n));
    }
    hay.to_lowercase().contains(needle_lower)
}

/// For each row of `array`, whether its text contains `needle` (lower case): texts
/// directly, lists and structs through the texts they hold, other values as displayed.
fn matches(array: &dyn Array, needle: &str) -> Result<Vec<bool>> {
    let n = array.len();
    Ok(match array.data_type() {
        DataType::Utf8 => {
            let s = array.as_string::<i32>();
            (0..n).map(|r| s.is_valid(r) && contains_lower(s.value(r), needle)).collect()
        }
        DataType::LargeUtf8 => {
            let s = array.as_string::<i64>();
            (0..n).map(|r| s.is_valid(r) && contains_lower(s.value(r), needle)).collect()
        }
        DataType::Utf8View => {
            let s = array.as_string_view();
            (0..n).map(|r| s.is_valid(r) && contains_lower(s.value(r), needle)).collect()
        }
        DataType::List(_) => list_matches(array.as_list::<i32>(), needle)?,
        DataType::LargeList(_) => list_matches(array.as_list::<i64>(), needle)?,
        DataType::Struct(_) => {
            let st = array.as_struct();
            let mut out = vec![false; n];
            for c in st.columns() {
                for (o, hit) in out.iter_mut().zip(matches(c.as_ref(), needle)?) {
                    *o |= hit;
                }
            }
            (0..n).map(|r| out[r] && st.is_valid(r)).collect()
        }
        _ => {
            let fmt = synth_core::data::arrow::util::display::ArrayFormatter::try_new(array, &Default::default())?;
            (0..n).map(|r| array.is_valid(r) && contains_lower(&fmt.value(r).to_string(), needle)).collect()
        }
    })
}

/// A sort key: numbers as numbers, anything else by the start of its text.
#[derive(Debug, PartialEq)]
enum Key {
    Null,
    Num(f64),
    Text(String),
}

impl Key {
    fn cmp_nulls_last(&self, other: &Key, descending: bool) -> std::cmp::Ordering {
        use std::cmp::Ordering::*;
        let o = match (self, other) {
            (Key::Null, Key::Null) => return Equal,
            (Key::Null, _) => return Greater,
            (_, Key::Null) => return Less,
            (Key::Num(a), Key::Num(b)) => a.total_cmp(b),
            (Key::Num(_), Key::Text(_)) => Less,
            (Key::Text(_), Key::Num(_)) => Greater,
            (Key::Text(a), Key::Text(b)) => a.cmp(b),
        };
        if descending { o.reverse() } else { o }
    }
}

/// For each list of `l`, whether any of its items' texts contains `needle`.
fn list_matches<O: synth_core::data::arrow::array::OffsetSizeTrait>(
    l: &synth_core::data::arrow::array::GenericListArray<O>,
    needle: &str,
) -> Result<Vec<bool>> {
    let inner = matches(l.values().as_ref(), needle)?;
    let offsets = l.value_offsets();
    Ok((0..l.len())
        .map(|r| l.is_valid(r) && inner[offsets[r].as_usize()..offsets[r + 1].as_usize()].iter().any(|x| *x))
        .collect())
}

/// The sort keys of a column's values.
fn keys_of(col: &ArrayRef) -> Result<Vec<Key>> {
    let n = col.len();
    let dt = col.data_type();
    if dt.is_numeric() {
        let f = synth_core::data::arrow::compute::cast(col, &DataType::Float64)?;
        let f = f.as_primitive::<synth_core::data::arrow::datatypes::Float64Type>();
        return Ok((0..n).map(|r| if f.is_null(r) { Key::Null } else { Key::Num(f.value(r)) }).collect());
    }
    if let DataType::Boolean = dt {
        let b = col.as_boolean();
        return Ok((0..n)
            .map(|r| if b.is_null(r) { Key::Null } else { Key::Num(f64::from(u8::from(b.value(r)))) })
            .collect());
    }
    let prefix = |s: &str| {
        let mut cut = s.len().min(SORT_PREFIX);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        Key::Text(s[..cut].to_string())
    };
    if let DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View = dt {
        let s = synth_core::data::arrow::compute::cast(col, &DataType::Utf8)?;
        let s = s.as_string::<i32>();
        return Ok((0..n).map(|r| if s.is_null(r) { Key::Null } else { prefix(s.value(r)) }).collect());
    }
    let fmt = synth_core::data::arrow::util::display::ArrayFormatter::try_new(col.as_ref(), &Default::default())?;
    Ok((0..n).map(|r| if col.is_null(r) { Key::Null } else { prefix(&fmt.value(r).to_string()) }).collect())
}

/// A batch as JSON objects (arrow's JSON writer: lists and structs nested, nulls kept).
pub fn batch_to_json(batch: &RecordBatch) -> Result<Vec<serde_json::Value>> {
    let mut buf = Vec::new();
    {
        let mut w = synth_core::data::arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, synth_core::data::arrow::json::writer::JsonArray>(&mut buf);
        w.write(batch)?;
        w.finish()?;
    }
    if buf.is_empty() {
        return Ok(Vec::new());
    }
    let v: Vec<serde_json::Value> = serde_json::from_slice(&buf)?;
    Ok(v)
}

/// The schema as `[{name, type}]`.
pub fn columns(schema: &SchemaRef) -> Vec<serde_json::Value> {
    schema.fields().iter().map(|f| serde_json::json!({"name": f.name(), "type": f.data_type().to_string()})).collect()
}

// ---- facets -----------------------------------------------------------------------

/// Distinct values a column may have and still be counted value by value.
const FACET_VALUES: usize = 1000;
/// Bytes a value may have and still be counted as a value (longer: its length is).
const FACET_SHORT: usize = 80;
/// Values shown of a counted column (the rest summed as "other").
const FACET_TOP: usize = 30;
/// Bars of a histogram.
const FACET_BINS: usize = 12;

/// A filter by one column's facet: its value, or its length (texts: characters; lists:
/// items) or number within `min..=max` (`min..max` when `open`), or its being null.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct FacetFilter {
    pub column: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eq: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    #[serde(default)]
    pub open: bool,
    #[serde(default)]
    pub null: bool,
}

impl FacetFilter {
    fn keeps(&self, v: &Cell) -> bool {
        match v {
            Cell::Null => self.null,
            _ if self.null => false,
            Cell::Text(s, len) => match &self.eq {
                Some(e) => e == s,
                None => self.within(*len as f64),
            },
            Cell::Num(x) => match &self.eq {
                Some(e) => e.parse::<f64>().is_ok_and(|e| e == *x),
                None => self.within(*x),
            },
            Cell::Items(n) => self.eq.is_none() && self.within(*n as f64),
        }
    }

    fn within(&self, x: f64) -> bool {
        let above = self.min.is_none_or(|m| x >= m);
        let below = self.max.is_none_or(|m| if self.open { x < m } else { x <= m });
        above && below
    }
}

/// What a facet reads of one row.
enum Cell<'a> {
    Null,
    /// A text and its length in characters.
    Text(&'a str, usize),
    Num(f64),
    /// A list's item count.
    Items(usize),
}

/// Calls `f` with each row's cell of one column batch.
fn cells(col: &ArrayRef, mut f: impl FnMut(Cell)) -> Result<()> {
    let n = col.len();
    match col.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let s = synth_core::data::arrow::compute::cast(col, &DataType::Utf8)?;
            let s = s.as_string::<i32>();
            for r in 0..n {
                if s.is_null(r) {
                    f(Cell::Null)
                } else {
                    let v = s.value(r);
                    f(Cell::Text(v, v.chars().count()))
                }
            }
        }
        DataType::Boolean => {
            let b = col.as_boolean();
            for r in 0..n {
                f(if b.is_null(r) { Cell::Null } else { Cell::Text(if b.value(r) { "true" } else { "false" }, 0) })
            }
        }
        dt if dt.is_numeric() => {
            let x = synth_core::data::arrow::compute::cast(col, &DataType::Float64)?;
            let x = x.as_primitive::<synth_core::data::arrow::datatypes::Float64Type>();
            for r in 0..n {
                f(if x.is_null(r) { Cell::Null } else { Cell::Num(x.value(r)) })
            }
        }
        DataType::List(_) => {
            let l = col.as_list::<i32>();
            for r in 0..n {
                f(if l.is_null(r) { Cell::Null } else { Cell::Items(l.value_length(r) as usize) })
            }
        }
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>();
            for r in 0..n {
                f(if l.is_null(r) { Cell::Null } else { Cell::Items(l.value_length(r) as usize) })
            }
        }
        other => anyhow::bail!("a column of type {other} has no facet"),
    }
    Ok(())
}

impl Table {
    /// Each batch of one column (a column read alone). A list of structs (a chat) is read
    /// through its smallest field only (a message's role, not its content): what a facet
    /// needs of it is each list's length.
    fn column_batches(&self, column: &str, mut f: impl FnMut(&ArrayRef) -> Result<()>) -> Result<()> {
        let idx = self.schema().index_of(column).with_context(|| format!("no column \"{column}\""))?;
        let descr = self.meta.parquet_schema();
        let list = matches!(self.schema().field(idx).data_type(), DataType::List(_) | DataType::LargeList(_));
        let leaves: Vec<usize> = (0..descr.num_columns()).filter(|l| descr.get_column_root_idx(*l) == idx).collect();
        let mask = if list && leaves.len() > 1 {
            let size = |leaf: usize| -> i64 {
                self.meta.metadata().row_groups().iter().map(|rg| rg.column(leaf).compressed_size()).sum()
            };
            let smallest = leaves.iter().copied().min_by_key(|l| (size(*l), *l)).expect("a leaf");
            ProjectionMask::leaves(descr, [smallest])
        } else {
            ProjectionMask::roots(descr, [idx])
        };
        for batch in self.builder()?.with_projection(mask).with_batch_size(8192).build()? {
            f(batch?.column(0))?;
        }
        Ok(())
    }

    /// A column's facet: value counts (the most frequent first) when its values are few and
    /// short; otherwise a histogram of lengths (texts: characters; lists: items) or of
    /// numbers. One pass over the column alone.
    pub fn facet(&self, column: &str) -> Result<serde_json::Value> {
        let mut values: Option<std::collections::HashMap<String, u64>> = Some(Default::default());
        let mut measures: Vec<f64> = Vec::new();
        let (mut nulls, mut unit) = (0u64, "");
        self.column_batches(column, |col| {
            cells(col, |c| match c {
                Cell::Null => nulls += 1,
                Cell::Text(s, len) => {
                    unit = "characters";
                    measures.push(len as f64);
                    if let Some(v) = &mut values {
                        if s.len() > FACET_SHORT || (v.len() >= FACET_VALUES && !v.contains_key(s)) {
                            values = None;
                        } else {
                            *v.entry(s.to_string()).or_default() += 1;
                        }
                    }
                }
                Cell::Num(x) => {
                    unit = "value";
                    measures.push(x);
                    values = None;
                }
                Cell::Items(n) => {
                    unit = "items";
                    measures.push(n as f64);
                    values = None;
                }
            })
        })?;
        let mut out = serde_json::json!({"column": column, "rows": self.rows(), "nulls": nulls});
        // Values when they are few, or repeat (a column of mostly distinct ids is lengths).
        let counted =
            values.filter(|v| !v.is_empty() && (v.len() <= 50 || (v.len() as f64) < 0.2 * measures.len() as f64));
        if let Some(v) = counted {
            let mut list: Vec<(String, u64)> = v.into_iter().collect();
            list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            let other: u64 = list.iter().skip(FACET_TOP).map(|x| x.1).sum();
            out["kind"] = "values".into();
            out["distinct"] = list.len().into();
            out["values"] = list
                .into_iter()
                .take(FACET_TOP)
                .map(|(value, count)| serde_json::json!({"value": value, "count": count}))
                .collect();
            out["other"] = other.into();
            return Ok(out);
        }
        out["kind"] = if unit == "value" { "numbers" } else { "lengths" }.into();
        out["unit"] = unit.into();
        out["bins"] = histogram(&measures, unit != "value").into();
        Ok(out)
    }

    /// Calls `f` with each row's `id` (a table without a text `id` column has none).
    pub fn each_id(&self, mut f: impl FnMut(&str)) -> Result<()> {
        let Ok(idx) = self.schema().index_of("id") else { return Ok(()) };
        if !matches!(self.schema().field(idx).data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
            return Ok(());
        }
        self.column_batches("id", |col| {
            cells(col, |c| {
                if let Cell::Text(id, _) = c {
                    f(id)
                }
            })
        })
    }

    /// Positions of the rows a facet filter keeps, in file order.
    pub fn facet_positions(&self, filter: &FacetFilter) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut at = 0u32;
        self.column_batches(&filter.column, |col| {
            cells(col, |c| {
                if filter.keeps(&c) {
                    out.push(at);
                }
                at += 1;
            })
        })?;
        Ok(out)
    }
}

/// [`FACET_BINS`] bars over `xs` (`{min, max, open, count}`; integer bounds for integer
/// measures, the last bar closed).
fn histogram(xs: &[f64], integers: bool) -> Vec<serde_json::Value> {
    let finite = || xs.iter().copied().filter(|x| x.is_finite());
    let (Some(lo), Some(hi)) = (finite().reduce(f64::min), finite().reduce(f64::max)) else { return Vec::new() };
    let integers = integers || finite().all(|x| x.fract() == 0.0);
    let bins = if integers {
        ((hi - lo) as usize + 1).min(FACET_BINS)
    } else if lo == hi {
        1
    } else {
        FACET_BINS
    };
    let width = if integers { ((hi - lo + 1.0) / bins as f64).ceil() } else { (hi - lo) / bins as f64 };
    let mut counts = vec![0u64; bins];
    for x in finite() {
        let i = if width > 0.0 { ((x - lo) / width).floor() as usize } else { 0 };
        counts[i.min(bins - 1)] += 1;
    }
    counts
        .iter()
        .enumerate()
        .map(|(i, count)| {
            let min = lo + i as f64 * width;
            let last = i + 1 == bins;
            let (max, open) = if integers {
                (if last { hi } else { min + width - 1.0 }, false)
            } else if last {
                (hi, false)
            } else {
                (min + width, true)
            };
            serde_json::json!({"min": min, "max": max, "open": open, "count": count})
        })
        .collect()
}

#[cfg(test)]
mod facet_tests {
    use super::*;

    #[test]
    fn bars_cover_every_value_once() {
        let xs: Vec<f64> = (0..100).map(f64::from).collect();
        let bars = histogram(&xs, true);
        assert_eq!(bars.len(), FACET_BINS);
        assert_eq!(bars.iter().map(|b| b["count"].as_u64().unwrap()).sum::<u64>(), 100);
        // Integer bars meet without overlap: each starts one after the last one's end.
        for w in bars.windows(2) {
            assert_eq!(w[0]["max"].as_f64().unwrap() + 1.0, w[1]["min"].as_f64().unwrap());
        }
        let floats = [0.25, 0.5, 0.75, 1.0];
        let bars = histogram(&floats, false);
        assert_eq!(bars.iter().map(|b| b["count"].as_u64().unwrap()).sum::<u64>(), 4);
        assert_eq!(bars.last().unwrap()["max"], 1.0);
        assert_eq!(histogram(&[3.0, 3.0], true).len(), 1);
        assert!(histogram(&[], true).is_empty());
    }

    #[test]
    fn a_filter_keeps_a_value_a_range_or_nulls() {
        let f =
            FacetFilter { column: "c".into(), eq: Some("a".into()), min: None, max: None, open: false, null: false };
        assert!(f.keeps(&Cell::Text("a", 1)) && !f.keeps(&Cell::Text("b", 1)) && !f.keeps(&Cell::Null));
        let r = FacetFilter { column: "c".into(), eq: None, min: Some(2.0), max: Some(4.0), open: true, null: false };
        assert!(r.keeps(&Cell::Text("ab", 2)) && !r.keeps(&Cell::Text("abcd", 4)) && r.keeps(&Cell::Items(3)));
        let n = FacetFilter { column: "c".into(), eq: None, min: None, max: None, open: false, null: true };
        assert!(n.keeps(&Cell::Null) && !n.keeps(&Cell::Num(1.0)));
    }
}
