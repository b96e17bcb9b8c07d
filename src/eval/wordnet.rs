//! WordNet 3.0 read straight from the Princeton dict files (Debian's `wordnet-base`,
//! `/usr/share/wordnet`), answering what NLTK's `WordNetCorpusReader` (NLTK 3.10) answers
//! for METEOR: the lemma names of the synsets of `wordnet.synsets(word)`, found through
//! NLTK's `_morphy` in the parts of speech noun, verb, adjective, adverb.
//!
//! Loading reads the four `index.*` files into memory and records where their lines start
//! (checking that they are sorted, so a lemma is found by binary search), and parses the
//! four small exception lists; the `data.*` files stay on disk and a synset's line is read
//! at its byte offset when asked for. Nothing is cached, so a `WordNet` is `Sync` and
//! lookups from many threads do not contend.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Parts of speech in the order NLTK's `POS_LIST` visits them: noun, verb, adjective,
/// adverb. Satellite adjectives (`s`) live in `data.adj` and are reached through `a`.
pub const POS_LIST: [Pos; 4] = [Pos::Noun, Pos::Verb, Pos::Adj, Pos::Adv];

/// A WordNet part of speech (file suffix and index letter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pos {
    Noun,
    Verb,
    Adj,
    Adv,
}

impl Pos {
    fn idx(self) -> usize {
        self as usize
    }

    /// The file suffix: `noun`, `verb`, `adj`, `adv`.
    pub fn file_suffix(self) -> &'static str {
        match self {
            Pos::Noun => "noun",
            Pos::Verb => "verb",
            Pos::Adj => "adj",
            Pos::Adv => "adv",
        }
    }

    /// The letter used in `index.*` lines: `n`, `v`, `a`, `r`.
    pub fn letter(self) -> &'static str {
        match self {
            Pos::Noun => "n",
            Pos::Verb => "v",
            Pos::Adj => "a",
            Pos::Adv => "r",
        }
    }

    /// NLTK's `MORPHOLOGICAL_SUBSTITUTIONS[pos]`, in order.
    fn substitutions(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Pos::Noun => &[
                ("s", ""),
                ("ses", "s"),
                ("ves", "f"),
                ("xes", "x"),
                ("zes", "z"),
                ("ches", "ch"),
                ("shes", "sh"),
                ("men", "man"),
                ("ies", "y"),
            ],
            Pos::Verb => {
                &[("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")]
            }
            Pos::Adj => &[("er", ""), ("est", ""), ("er", "e"), ("est", "e")],
            Pos::Adv => &[],
        }
    }
}

/// A synset: its part of speech (data file) and byte offset in that file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SynsetId {
    pub pos: Pos,
    pub offset: u64,
}

/// Why WordNet could not be loaded.
#[derive(Debug)]
pub enum WordNetError {
    /// The directory or one of the dict files is absent.
    Missing { dir: PathBuf, file: &'static str },
    /// A file exists but could not be read.
    Io { path: PathBuf, source: io::Error },
    /// A file is not in the WordNet dict format this reader expects.
    Format { path: PathBuf, line: usize, message: String },
}

impl fmt::Display for WordNetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WordNetError::Missing { dir, file } => write!(
                f,
                "WordNet not found at {} ({file} missing): install Debian's wordnet-base \
                 (apt-get install wordnet-base) or set wordnet_dir to a WordNet 3.0 dict directory",
                dir.display()
            ),
            WordNetError::Io { path, source } => write!(f, "WordNet: cannot read {}: {source}", path.display()),
            WordNetError::Format { path, line, message } => {
                write!(f, "WordNet: {} line {line}: {message}", path.display())
            }
        }
    }
}

impl std::error::Error for WordNetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WordNetError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// One `index.<pos>` file: its bytes and the start of every entry line, sorted by lemma.
struct Index {
    text: Vec<u8>,
    /// Byte offset of each entry line (license lines, which start with a space, excluded).
    lines: Vec<u32>,
}

impl Index {
    fn lemma_at(&self, i: usize) -> &[u8] {
        let start = self.lines[i] as usize;
        let rest = &self.text[start..];
        let end = rest.iter().position(|&b| b == b' ' || b == b'\n').unwrap_or(rest.len());
        &rest[..end]
    }

    /// The entry line of `lemma`, without its newline.
    fn find(&self, lemma: &str) -> Option<&[u8]> {
        let key = lemma.as_bytes();
        let (mut lo, mut hi) = (0usize, self.lines.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.lemma_at(mid).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => {
                    let start = self.lines[mid] as usize;
                    let rest = &self.text[start..];
                    let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
                    return Some(&rest[..end]);
                }
            }
        }
        None
    }
}

/// WordNet 3.0 dict files, ready for NLTK-compatible synset and lemma lookups.
pub struct WordNet {
    dir: PathBuf,
    index: [Index; 4],
    /// `<pos>.exc`: inflected form → base forms (a later line for the same form wins, as
    /// in NLTK's dict).
    exceptions: [fnv::FnvHashMap<String, Vec<String>>; 4],
    data: [File; 4],
}

/// The files `load` needs, in the order their absence is reported.
const REQUIRED: [&str; 12] = [
    "data.noun",
    "data.verb",
    "data.adj",
    "data.adv",
    "index.noun",
    "index.verb",
    "index.adj",
    "index.adv",
    "noun.exc",
    "verb.exc",
    "adj.exc",
    "adv.exc",
];

impl WordNet {
    /// Loads the dict files of `dir` (e.g. `/usr/share/wordnet`). Fails naming the first
    /// missing file, or the file and line that is not in WordNet's format.
    pub fn load(dir: impl AsRef<Path>) -> Result<WordNet, WordNetError> {
        let dir = dir.as_ref().to_path_buf();
        for file in REQUIRED {
            if !dir.join(file).is_file() {
                return Err(WordNetError::Missing { dir, file });
            }
        }
        let read = |name: String| -> Result<(PathBuf, Vec<u8>), WordNetError> {
            let path = dir.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => Ok((path, bytes)),
                Err(source) => Err(WordNetError::Io { path, source }),
            }
        };
        let mut index = Vec::with_capacity(4);
        let mut exceptions = Vec::with_capacity(4);
        let mut data = Vec::with_capacity(4);
        for pos in POS_LIST {
            let (path, text) = read(format!("index.{}", pos.file_suffix()))?;
            index.push(parse_index(&path, text, pos)?);
            let (path, text) = read(format!("{}.exc", pos.file_suffix()))?;
            exceptions.push(parse_exceptions(&path, &text)?);
            let path = dir.join(format!("data.{}", pos.file_suffix()));
            data.push(File::open(&path).map_err(|source| WordNetError::Io { path, source })?);
        }
        Ok(WordNet {
            dir,
            index: index.try_into().unwrap_or_else(|_| unreachable!()),
            exceptions: exceptions.try_into().unwrap_or_else(|_| unreachable!()),
            data: data.try_into().unwrap_or_else(|_| unreachable!()),
        })
    }

    /// The directory the files were read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// NLTK's `_morphy(form, pos)` (NLTK 3.10): the exception list's base forms if `form` is
    /// in it, else the suffix substitutions applied once; `form` itself first; only those
    /// that are lemmas of `pos`, without repeats.
    pub fn morphy(&self, form: &str, pos: Pos) -> Vec<String> {
        let mut candidates: Vec<String> = vec![form.to_string()];
        if let Some(bases) = self.exceptions[pos.idx()].get(form) {
            candidates.extend(bases.iter().cloned());
        } else {
            for (old, new) in pos.substitutions() {
                if let Some(stem) = form.strip_suffix(old) {
                    candidates.push(format!("{stem}{new}"));
                }
            }
        }
        let mut out: Vec<String> = Vec::new();
        for c in candidates {
            if !out.contains(&c) && self.index[pos.idx()].find(&c).is_some() {
                out.push(c);
            }
        }
        out
    }

    /// NLTK's `wordnet.synsets(word)`: the word lowercased (`str.lower`), then for each part
    /// of speech in [`POS_LIST`], for each form `_morphy` gives, the synsets of that form's
    /// index entry, in file order (repeats kept, as NLTK keeps them).
    pub fn synsets(&self, word: &str) -> Vec<SynsetId> {
        let lemma = word.to_lowercase();
        let mut out = Vec::new();
        for pos in POS_LIST {
            for form in self.morphy(&lemma, pos) {
                if let Some(line) = self.index[pos.idx()].find(&form) {
                    out.extend(index_offsets(line).into_iter().map(|offset| SynsetId { pos, offset }));
                }
            }
        }
        out
    }

    /// The lemma names of a synset as NLTK's `Lemma.name()` gives them: case as in the data
    /// file, words joined by `_`, an adjective's syntactic marker (`(a)`, `(p)`, `(ip)`)
    /// removed. Empty if the data file has no synset at that offset (NLTK warns and returns
    /// `None` there).
    pub fn lemma_names(&self, synset: SynsetId) -> Vec<String> {
        match self.read_data_line(synset) {
            Some(line) => parse_lemma_names(&line).unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// What METEOR's WordNet stage takes from `word`: the names of the lemmas of all
    /// `synsets(word)` that contain no `_` (NLTK: `lemma.name().find("_") < 0`), as a set.
    /// (METEOR adds the word itself.)
    pub fn synonyms(&self, word: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for synset in self.synsets(word) {
            for name in self.lemma_names(synset) {
                if !name.contains('_') {
                    out.insert(name);
                }
            }
        }
        out
    }

    /// The data line of `synset`, if its offset starts a line carrying that offset.
    fn read_data_line(&self, synset: SynsetId) -> Option<String> {
        let file = &self.data[synset.pos.idx()];
        let mut buf = vec![0u8; 1024];
        let mut len = 0usize;
        loop {
            let n = read_at(file, &mut buf[len..], synset.offset + len as u64).ok()?;
            if n == 0 {
                break;
            }
            len += n;
            if buf[..len].contains(&b'\n') {
                break;
            }
            if len == buf.len() {
                buf.resize(buf.len() * 2, 0);
            }
        }
        let line = &buf[..len];
        let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
        let expected = format!("{:08}", synset.offset);
        if line.len() < 8 || line[..8] != *expected.as_bytes() {
            return None;
        }
        String::from_utf8(line.to_vec()).ok()
    }
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, offset)
}

#[cfg(windows)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, offset)
}

/// Records the entry lines of an index file and checks that their lemmas are strictly
/// increasing (so binary search finds what NLTK's dict finds) and carry `pos`.
fn parse_index(path: &Path, text: Vec<u8>, pos: Pos) -> Result<Index, WordNetError> {
    if text.len() > u32::MAX as usize {
        return Err(WordNetError::Format { path: path.to_path_buf(), line: 0, message: "file too large".into() });
    }
    let mut lines: Vec<u32> = Vec::with_capacity(text.len() / 40);
    let mut prev: &[u8] = &[];
    let mut start = 0usize;
    let mut lineno = 0usize;
    while start < text.len() {
        lineno += 1;
        let end = text[start..].iter().position(|&b| b == b'\n').map_or(text.len(), |p| start + p);
        let line = &text[start..end];
        if !line.is_empty() && line[0] != b' ' {
            let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
            let lemma = fields.next().unwrap_or_default();
            let bad = |message: String| WordNetError::Format { path: path.to_path_buf(), line: lineno, message };
            if fields.next() != Some(pos.letter().as_bytes()) {
                return Err(bad(format!("expected part of speech \"{}\"", pos.letter())));
            }
            if lemma <= prev {
                return Err(bad("lemmas are not in increasing byte order".into()));
            }
            if std::str::from_utf8(lemma).is_err() {
                return Err(bad("lemma is not UTF-8".into()));
            }
            prev = lemma;
            lines.push(start as u32);
        }
        start = end + 1;
    }
    Ok(Index { text, lines })
}

/// The synset offsets of an index entry line: `lemma pos synset_cnt p_cnt [ptr_symbol...]
/// sense_cnt tagsense_cnt synset_offset...`.
fn index_offsets(line: &[u8]) -> Vec<u64> {
    let text = String::from_utf8_lossy(line);
    let mut fields = text.split_ascii_whitespace();
    let _lemma = fields.next();
    let _pos = fields.next();
    let Some(n_synsets) = fields.next().and_then(|f| f.parse::<usize>().ok()) else { return Vec::new() };
    let Some(n_pointers) = fields.next().and_then(|f| f.parse::<usize>().ok()) else { return Vec::new() };
    let mut fields = fields.skip(n_pointers + 2); // pointer symbols, sense_cnt, tagsense_cnt
    (0..n_synsets).filter_map(|_| fields.next().and_then(|f| f.parse::<u64>().ok())).collect()
}

/// `<pos>.exc`: `inflected base...` per line.
fn parse_exceptions(path: &Path, text: &[u8]) -> Result<fnv::FnvHashMap<String, Vec<String>>, WordNetError> {
    let text = std::str::from_utf8(text).map_err(|e| WordNetError::Format {
        path: path.to_path_buf(),
        line: 0,
        message: format!("not UTF-8: {e}"),
    })?;
    let mut map = fnv::FnvHashMap::default();
    for line in text.lines() {
        let mut terms = line.split_whitespace();
        if let Some(form) = terms.next() {
            map.insert(form.to_string(), terms.map(str::to_string).collect());
        }
    }
    Ok(map)
}

/// The lemma names of a data line: `offset lex_filenum ss_type w_cnt(hex) (word lex_id)...`.
fn parse_lemma_names(line: &str) -> Option<Vec<String>> {
    let columns = line.split('|').next()?;
    let mut fields = columns.split_ascii_whitespace();
    let _offset = fields.next()?;
    let _lex_filenum = fields.next()?;
    let _ss_type = fields.next()?;
    let n = usize::from_str_radix(fields.next()?, 16).ok()?;
    let mut names = Vec::with_capacity(n);
    for _ in 0..n {
        let name = fields.next()?;
        let _lex_id = fields.next()?;
        names.push(strip_marker(name).to_string());
    }
    Some(names)
}

/// NLTK: `re.match(r"(.*?)(\([^()]*\))?$", name).group(1)`: one trailing `(...)` without
/// inner parentheses is a syntactic marker.
fn strip_marker(name: &str) -> &str {
    if let Some(body) = name.strip_suffix(')')
        && let Some(open) = body.rfind('(')
        && !body[open + 1..].contains(')')
    {
        return &name[..open];
    }
    name
}

#[cfg(test)]
mod tests {
    use super::strip_marker;

    #[test]
    fn markers() {
        assert_eq!(strip_marker("galore(ip)"), "galore");
        assert_eq!(strip_marker("outback(a)"), "outback");
        assert_eq!(strip_marker("plain"), "plain");
        assert_eq!(strip_marker("a(b)c"), "a(b)c");
    }
}
