//! The check kinds: `debris`, `repetition`, `echo`, `language`, `length`, `chat`. Each
//! reads the texts its `fields` select from a record (by default every text of the
//! fields the stage checks) and says what is wrong in words a model can act on when
//! it is asked again.

use std::collections::HashSet;
use std::hash::BuildHasher;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::select::{Found, Selector};
use super::text;
use synth_core::config::options::{OptionSpec, RATIO, Ty, UINT};

/// What a check sees of one record.
pub struct Subject<'a> {
    /// The values checked: a model stage's parsed answer, or a record of a `check` stage.
    pub fields: &'a Map<String, Value>,
    /// The record the answer is for (the model stage's input); the same as `fields` in a
    /// `check` stage.
    pub record: &'a Map<String, Value>,
    /// The prompt the model was sent (user and system messages), when there is one.
    pub prompt: Option<&'a str>,
}

/// One configured check of a kind.
pub trait Check: Send + Sync {
    /// What is wrong with the record (empty: it passes).
    fn problems(&self, subject: &Subject<'_>) -> Vec<String>;
    /// Columns of the checked record (or of the input record) the check reads, for plan checks.
    fn columns(&self) -> Vec<String> {
        Vec::new()
    }
}

/// What the check kinds are built from besides their options.
pub struct Env<'a> {
    /// The fields checked when a check names none (the parser's columns; empty: every
    /// column of the record but its id).
    pub default_fields: &'a [String],
}

/// Builds a check from its options.
pub type BuildCheck = fn(&Value, &Env<'_>) -> Result<Box<dyn Check>, String>;

/// A check kind: its name, what it does, its options and its constructor.
pub struct CheckKind {
    pub name: &'static str,
    pub about: &'static str,
    pub options: &'static [OptionSpec],
    pub build: BuildCheck,
}

/// Options every check takes.
pub const COMMON: &[OptionSpec] = &[
    OptionSpec::optional("kind", Ty::Str, "the check kind (default: the entry's name)"),
    OptionSpec::default(
        "action",
        Ty::Enum(&["reask", "drop", "flag"]),
        "\"reask\"",
        "what a failure does: reask (ask the model again with the reason, then drop after max_attempts), drop (at once), flag (count it only)",
    ),
    OptionSpec::optional(
        "fields",
        Ty::StrList,
        "field selectors of the texts to check (`col`, `col[].key`, `col[key=value].key`; default: every text of the checked fields)",
    ),
    OptionSpec::optional(
        "when",
        Ty::Str,
        "an expression over the record's columns (a model stage's input record): the check applies only where it is true (e.g. `rule_id != 'output_constraint-02'`)",
    ),
];

pub static KINDS: &[&CheckKind] = &[&DEBRIS, &REPETITION, &ECHO, &LANGUAGE, &LENGTH, &CHAT];

fn options<T: for<'de> Deserialize<'de>>(v: &Value) -> Result<T, String> {
    let mut obj = v.as_object().cloned().unwrap_or_default();
    for k in ["kind", "action", "when"] {
        obj.remove(k);
    }
    serde_json::from_value(Value::Object(obj)).map_err(|e| e.to_string())
}

/// The selectors of a check: its `fields`, or the default fields.
fn selectors(v: &Value, env: &Env<'_>) -> Result<Vec<Selector>, String> {
    let given: Option<Vec<String>> = match v.get("fields") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(vec![s.clone()]),
        Some(Value::Array(a)) => Some(a.iter().map(|x| x.as_str().unwrap_or_default().to_string()).collect()),
        Some(other) => return Err(format!("fields must be a list of selectors, found {other}")),
    };
    match given {
        Some(list) => list.iter().map(|s| Selector::parse(s)).collect(),
        None if env.default_fields.is_empty() => Ok(vec![Selector::all()]),
        None => env.default_fields.iter().map(|s| Selector::parse(s)).collect(),
    }
}

fn find_all<'a>(sel: &[Selector], fields: &'a Map<String, Value>) -> Vec<Found<'a>> {
    sel.iter().flat_map(|s| s.find(fields)).collect()
}

fn columns_of(sel: &[Selector]) -> Vec<String> {
    sel.iter().filter_map(|s| s.column().map(str::to_string)).collect()
}

// ------------------------------------------------------------------ debris

pub static DEBRIS: CheckKind = CheckKind {
    name: "debris",
    about: "texts that are debris, not words: empty, fewer than `min_letters` letters (`][`, `{{`), serialized data (`[{'name': ...`), template leftovers, brackets where words should be, or a listed placeholder",
    options: &[
        OptionSpec::default("min_letters", UINT, "2", "fewest letters a text must have"),
        OptionSpec::optional(
            "allow_empty",
            Ty::StrList,
            "selectors whose texts may be empty (e.g. an optional narration)",
        ),
        OptionSpec::optional(
            "placeholders",
            Ty::StrList,
            "texts that mark an unfilled template (case-insensitive substrings, e.g. \"[One turn of content\")",
        ),
    ],
    build: |v, env| {
        #[derive(Deserialize)]
        struct O {
            #[serde(default = "two")]
            min_letters: usize,
            #[serde(default)]
            allow_empty: Option<Vec<String>>,
            #[serde(default)]
            placeholders: Option<Vec<String>>,
        }
        fn two() -> usize {
            2
        }
        let o: O = options(v)?;
        let allow_empty =
            o.allow_empty.unwrap_or_default().iter().map(|s| Selector::parse(s)).collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(Debris {
            fields: selectors(v, env)?,
            min_letters: o.min_letters,
            allow_empty,
            placeholders: o.placeholders.unwrap_or_default().iter().map(|p| p.to_lowercase()).collect(),
        }))
    },
};

struct Debris {
    fields: Vec<Selector>,
    min_letters: usize,
    allow_empty: Vec<Selector>,
    placeholders: Vec<String>,
}

impl Check for Debris {
    fn problems(&self, s: &Subject<'_>) -> Vec<String> {
        let may_be_empty: HashSet<String> =
            self.allow_empty.iter().flat_map(|sel| sel.find(s.fields)).map(|f| f.at).collect();
        let mut out = Vec::new();
        for f in find_all(&self.fields, s.fields) {
            if f.text.trim().is_empty() && may_be_empty.contains(&f.at) {
                continue;
            }
            if let Some(why) = text::debris(&f.text, self.min_letters) {
                out.push(format!("{} {why}; write it in words", f.at));
                continue;
            }
            let lower = f.text.to_lowercase();
            if let Some(p) = self.placeholders.iter().find(|p| lower.contains(p.as_str())) {
                out.push(format!("{} holds the placeholder {}; write real content", f.at, text::quoted(p)));
            }
        }
        out
    }
    fn columns(&self) -> Vec<String> {
        columns_of(&self.fields)
    }
}

// -------------------------------------------------------------- repetition

pub static REPETITION: CheckKind = CheckKind {
    name: "repetition",
    about: "repeated text (the Gopher rules): duplicate lines or items, the most frequent 2/3/4-gram's share, characters in repeated 5..10-grams",
    options: &[
        OptionSpec::default(
            "scope",
            Ty::Enum(&["each", "joined"]),
            "\"each\"",
            "each: every text on its own; joined: the texts joined, one per line (a dialogue's turns)",
        ),
        OptionSpec::default(
            "max_duplicate_line_fraction",
            RATIO,
            "0.3",
            "share of lines (and of the selected texts of 3+ words) that repeat an earlier one",
        ),
        OptionSpec::default(
            "min_words",
            UINT,
            "50",
            "n-gram shares are measured on texts of at least this many words (Gopher's shortest document; a short text repeats a word pair by chance)",
        ),
        OptionSpec::default(
            "max_top_ngram",
            Ty::List(&RATIO),
            "[0.2, 0.18, 0.16]",
            "for n = 2, 3, 4: the most frequent repeated n-gram's share of the characters",
        ),
        OptionSpec::default(
            "max_duplicate_ngram",
            Ty::List(&RATIO),
            "[0.15, 0.14, 0.13, 0.12, 0.11, 0.10]",
            "for n = 5..10: share of characters inside repeated n-grams",
        ),
    ],
    build: |v, env| {
        #[derive(Deserialize)]
        struct O {
            #[serde(default)]
            scope: Option<String>,
            #[serde(default)]
            max_duplicate_line_fraction: Option<f64>,
            #[serde(default)]
            min_words: Option<usize>,
            #[serde(default)]
            max_top_ngram: Option<Vec<f64>>,
            #[serde(default)]
            max_duplicate_ngram: Option<Vec<f64>>,
        }
        let o: O = options(v)?;
        let top = o.max_top_ngram.unwrap_or_else(|| vec![0.2, 0.18, 0.16]);
        let dup = o.max_duplicate_ngram.unwrap_or_else(|| vec![0.15, 0.14, 0.13, 0.12, 0.11, 0.10]);
        if top.len() != 3 {
            return Err(format!("max_top_ngram needs 3 values (n = 2, 3, 4), found {}", top.len()));
        }
        if dup.len() != 6 {
            return Err(format!("max_duplicate_ngram needs 6 values (n = 5..10), found {}", dup.len()));
        }
        Ok(Box::new(Repeats {
            fields: selectors(v, env)?,
            joined: o.scope.as_deref() == Some("joined"),
            max_lines: o.max_duplicate_line_fraction.unwrap_or(0.3),
            min_words: o.min_words.unwrap_or(50),
            top: top.try_into().expect("3"),
            dup: dup.try_into().expect("6"),
        }))
    },
};

struct Repeats {
    fields: Vec<Selector>,
    joined: bool,
    max_lines: f64,
    min_words: usize,
    top: [f64; 3],
    dup: [f64; 6],
}

impl Repeats {
    fn measure(&self, at: &str, t: &str, out: &mut Vec<String>) {
        let r = text::repetition(t);
        if r.duplicate_line_fraction > self.max_lines {
            out.push(format!(
                "{at} repeats its lines ({:.0}% of them are copies of an earlier line); say something new in each",
                r.duplicate_line_fraction * 100.0
            ));
            return;
        }
        if text::word_units(t) < self.min_words {
            return;
        }
        for (k, (got, max)) in r.top_ngram.iter().zip(self.top).enumerate() {
            if *got > max {
                out.push(format!(
                    "{at} repeats one phrase of {} words ({:.0}% of its text); vary the wording",
                    k + 2,
                    got * 100.0
                ));
                return;
            }
        }
        for (k, (got, max)) in r.duplicate_ngram.iter().zip(self.dup).enumerate() {
            if *got > max {
                out.push(format!(
                    "{at} repeats itself ({:.0}% of its text is in repeated {}-word passages); do not repeat sentences",
                    got * 100.0,
                    k + 5
                ));
                return;
            }
        }
    }
}

impl Check for Repeats {
    fn problems(&self, s: &Subject<'_>) -> Vec<String> {
        let found = find_all(&self.fields, s.fields);
        let mut out = Vec::new();
        // Texts of three or more words that are copies of an earlier selected text.
        let long: Vec<&Found<'_>> = found.iter().filter(|f| text::word_units(&f.text) >= 3).collect();
        if long.len() > 1 {
            // By the hash of its words (as `words` reads them), without a string per word.
            let mut seen = rustc_hash::FxHashSet::default();
            let copies: Vec<&str> = long
                .iter()
                .filter(|f| !seen.insert(rustc_hash::FxBuildHasher.hash_one(text::word_keys(&f.text).0)))
                .map(|f| f.at.as_str())
                .collect();
            if copies.len() as f64 / long.len() as f64 > self.max_lines {
                out.push(format!(
                    "{} repeat(s) an earlier item word for word ({} of {}); make each one different",
                    copies.join(", "),
                    copies.len(),
                    long.len()
                ));
            }
        }
        if self.joined {
            let joined = found.iter().map(|f| f.text.trim()).collect::<Vec<_>>().join("\n");
            let label = self.fields.iter().map(Selector::as_str).collect::<Vec<_>>().join(", ");
            self.measure(&label, &joined, &mut out);
        } else {
            for f in &found {
                self.measure(&f.at, &f.text, &mut out);
            }
        }
        out
    }
    fn columns(&self) -> Vec<String> {
        columns_of(&self.fields)
    }
}

// -------------------------------------------------------------------- echo

pub static ECHO: CheckKind = CheckKind {
    name: "echo",
    about: "texts that copy their source (the prompt, the role profile): the share of a text's word n-grams found in `of` above `max_overlap`",
    options: &[
        OptionSpec::required(
            "of",
            Ty::StrList,
            "what a text must not copy: \"prompt\" (the messages sent) or columns of the record",
        ),
        OptionSpec::optional(
            "ignore",
            Ty::StrList,
            "columns of the record whose n-grams may be copied (e.g. the persona the profile must keep)",
        ),
        OptionSpec::default("n", Ty::Int(2, 20), "6", "n-gram length in words"),
        OptionSpec::default("max_overlap", RATIO, "0.5", "share of a text's n-grams that may come from the source"),
    ],
    build: |v, env| {
        #[derive(Deserialize)]
        struct O {
            of: Vec<String>,
            #[serde(default)]
            ignore: Option<Vec<String>>,
            #[serde(default)]
            n: Option<usize>,
            #[serde(default)]
            max_overlap: Option<f64>,
        }
        let o: O = options(v)?;
        if o.of.is_empty() {
            return Err("`of` names nothing to compare with".into());
        }
        Ok(Box::new(Echo {
            fields: selectors(v, env)?,
            of: o.of,
            ignore: o.ignore.unwrap_or_default(),
            n: o.n.unwrap_or(6),
            max: o.max_overlap.unwrap_or(0.5),
        }))
    },
};

struct Echo {
    fields: Vec<Selector>,
    of: Vec<String>,
    ignore: Vec<String>,
    n: usize,
    max: f64,
}

fn record_text(record: &Map<String, Value>, column: &str) -> String {
    match record.get(column) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => {
            let mut out = Vec::new();
            let wrap: Map<String, Value> = [(column.to_string(), other.clone())].into_iter().collect();
            for f in Selector::parse(column).map(|s| s.find(&wrap)).unwrap_or_default() {
                out.push(f.text.into_owned());
            }
            out.join("\n")
        }
    }
}

impl Check for Echo {
    fn problems(&self, s: &Subject<'_>) -> Vec<String> {
        let found = find_all(&self.fields, s.fields);
        // The checked texts' n-grams first (a few hundred), then the sources are streamed
        // past them: only the n-grams a text shares with a source are kept, never the set
        // of a whole prompt (what an answer can copy is what it holds).
        let mut wanted = text::NgramSet::default();
        for f in &found {
            text::for_each_ngram(&f.text, self.n, |g| {
                wanted.insert(g);
            });
        }
        if wanted.is_empty() {
            return Vec::new();
        }
        let mut source = text::NgramSet::default();
        for of in &self.of {
            let t: std::borrow::Cow<'_, str> =
                if of == "prompt" { s.prompt.unwrap_or_default().into() } else { record_text(s.record, of).into() };
            text::for_each_ngram(&t, self.n, |g| {
                if wanted.contains(&g) {
                    source.insert(g);
                }
            });
        }
        for col in &self.ignore {
            text::for_each_ngram(&record_text(s.record, col), self.n, |g| {
                source.remove(&g);
            });
        }
        if source.is_empty() {
            return Vec::new();
        }
        let what = self.of.join(", ");
        let mut out = Vec::new();
        for f in found {
            if let Some(share) = text::overlap(&f.text, &source, self.n)
                && share > self.max
            {
                let copied = text::first_shared(&f.text, &source, self.n).unwrap_or_default();
                out.push(format!(
                    "{} copies {} from the {what} ({:.0}% of its {}-word phrases are there); write it in your own words",
                    f.at,
                    text::quoted(&copied),
                    share * 100.0,
                    self.n
                ));
            }
        }
        out
    }
    fn columns(&self) -> Vec<String> {
        columns_of(&self.fields)
    }
}

// ---------------------------------------------------------------- language

pub static LANGUAGE: CheckKind = CheckKind {
    name: "language",
    about: "texts in another script or language than the pipeline's: the share of letters in the language's script, then (for texts of `detect_min_letters` letters or more) the language whatlang identifies with confidence",
    options: &[
        OptionSpec::default(
            "language",
            Ty::Str,
            "\"en\"",
            "the expected language (ISO 639-1 or 639-3: \"en\", \"zh\", \"eng\", \"cmn\")",
        ),
        OptionSpec::optional(
            "language_column",
            Ty::Str,
            "a column of the record holding each record's language code (overrides `language` where it is set)",
        ),
        OptionSpec::default("min_script_share", RATIO, "0.9", "share of letters that must be in the language's script"),
        OptionSpec::default(
            "detect_min_letters",
            UINT,
            "80",
            "identify the language only in texts with this many letters (shorter ones are checked by script)",
        ),
    ],
    build: |v, env| {
        #[derive(Deserialize)]
        struct O {
            #[serde(default)]
            language: Option<String>,
            #[serde(default)]
            language_column: Option<String>,
            #[serde(default)]
            min_script_share: Option<f64>,
            #[serde(default)]
            detect_min_letters: Option<usize>,
        }
        let o: O = options(v)?;
        let code = o.language.unwrap_or_else(|| "en".into());
        let lang = language_of(&code)?;
        let script = script_of(lang, &code)?;
        Ok(Box::new(Language {
            fields: selectors(v, env)?,
            lang,
            script,
            column: o.language_column,
            min_share: o.min_script_share.unwrap_or(0.9),
            detect_min: o.detect_min_letters.unwrap_or(80),
        }))
    },
};

/// A language by ISO 639-1 (two letters, the common ones) or ISO 639-3 code.
fn language_of(code: &str) -> Result<whatlang::Lang, String> {
    let three = match code.to_ascii_lowercase().as_str() {
        "en" => "eng",
        "zh" => "cmn",
        "fr" => "fra",
        "de" => "deu",
        "es" => "spa",
        "it" => "ita",
        "pt" => "por",
        "ru" => "rus",
        "ja" => "jpn",
        "ko" => "kor",
        "ar" => "ara",
        "hi" => "hin",
        "nl" => "nld",
        other => return whatlang::Lang::from_code(other).ok_or_else(|| format!("unknown language \"{code}\"")),
    };
    Ok(whatlang::Lang::from_code(three).expect("a known code"))
}

/// The script a language is written in.
fn script_of(lang: whatlang::Lang, code: &str) -> Result<whatlang::Script, String> {
    whatlang::Script::all()
        .iter()
        .copied()
        .find(|s| s.langs().contains(&lang))
        .ok_or_else(|| format!("no script known for language \"{code}\""))
}

/// Characters of a text whose language whatlang identifies.
const DETECT_CHARS: usize = 600;

struct Language {
    fields: Vec<Selector>,
    lang: whatlang::Lang,
    script: whatlang::Script,
    column: Option<String>,
    min_share: f64,
    detect_min: usize,
}

impl Check for Language {
    fn problems(&self, s: &Subject<'_>) -> Vec<String> {
        let found = find_all(&self.fields, s.fields);
        let joined = found.iter().map(|f| f.text.as_ref()).collect::<Vec<_>>().join("\n");
        let (lang, script) = match self.column.as_deref().and_then(|c| s.record.get(c)).and_then(Value::as_str) {
            Some(code) => match language_of(code).and_then(|l| script_of(l, code).map(|s| (l, s))) {
                Ok(x) => x,
                Err(e) => return vec![format!("the record's language: {e}")],
            },
            None => (self.lang, self.script),
        };
        let (share, main) = text::script_share(&joined, script);
        let name = lang.eng_name();
        if share < self.min_share {
            let other = main.map(|m| format!(", the rest mostly in {} script", m.name())).unwrap_or_default();
            return vec![format!(
                "the answer is not all in {name}: only {:.0}% of its letters are in {} script{other}; write in {name}",
                share * 100.0,
                script.name()
            )];
        }
        // The language is read from the first 600 characters (whatlang's trigram profile
        // settles long before: ~100 words; a whole profile or dialogue costs four to ten
        // times as much); the script share above reads every letter.
        let head = joined.char_indices().nth(DETECT_CHARS).map_or(joined.as_str(), |(i, _)| &joined[..i]);
        if text::letters(&joined) >= self.detect_min
            && let Some(info) = whatlang::detect(head)
            && info.is_reliable()
            && info.lang() != lang
            && info.script() == script
        {
            return vec![format!("the answer reads as {}, not {name}; write in {name}", info.lang().eng_name())];
        }
        Vec::new()
    }
    fn columns(&self) -> Vec<String> {
        columns_of(&self.fields)
    }
}

// ------------------------------------------------------------------ length

pub static LENGTH: CheckKind = CheckKind {
    name: "length",
    about: "length bounds in words (a CJK character is a word) or characters, on each text, their mean or their sum; and how many texts there are",
    options: &[
        OptionSpec::optional("min_words", UINT, "fewest words"),
        OptionSpec::optional("max_words", UINT, "most words"),
        OptionSpec::optional("min_chars", UINT, "fewest characters"),
        OptionSpec::optional("max_chars", UINT, "most characters"),
        OptionSpec::default(
            "over",
            Ty::Enum(&["each", "mean", "sum"]),
            "\"each\"",
            "bounds apply to each text, to their mean, or to their sum",
        ),
        OptionSpec::optional("min_items", UINT, "fewest texts the fields must hold"),
        OptionSpec::optional("max_items", UINT, "most texts the fields may hold"),
    ],
    build: |v, env| {
        #[derive(Deserialize)]
        struct O {
            min_words: Option<usize>,
            max_words: Option<usize>,
            min_chars: Option<usize>,
            max_chars: Option<usize>,
            #[serde(default)]
            over: Option<String>,
            min_items: Option<usize>,
            max_items: Option<usize>,
        }
        let o: O = options(v)?;
        for (lo, hi, what) in [
            (o.min_words, o.max_words, "words"),
            (o.min_chars, o.max_chars, "chars"),
            (o.min_items, o.max_items, "items"),
        ] {
            if let (Some(lo), Some(hi)) = (lo, hi)
                && lo > hi
            {
                return Err(format!("min_{what} ({lo}) is above max_{what} ({hi})"));
            }
        }
        Ok(Box::new(Length {
            fields: selectors(v, env)?,
            words: (o.min_words, o.max_words),
            chars: (o.min_chars, o.max_chars),
            over: o.over.unwrap_or_else(|| "each".into()),
            items: (o.min_items, o.max_items),
        }))
    },
};

struct Length {
    fields: Vec<Selector>,
    words: (Option<usize>, Option<usize>),
    chars: (Option<usize>, Option<usize>),
    over: String,
    items: (Option<usize>, Option<usize>),
}

fn bound(out: &mut Vec<String>, what: &str, got: f64, (lo, hi): (Option<usize>, Option<usize>), unit: &str) {
    if let Some(lo) = lo
        && got < lo as f64
    {
        out.push(format!("{what} has {} {unit}; write at least {lo}", fmt_num(got)));
    } else if let Some(hi) = hi
        && got > hi as f64
    {
        out.push(format!("{what} has {} {unit}; write at most {hi}", fmt_num(got)));
    }
}

fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.1}") }
}

impl Check for Length {
    fn problems(&self, s: &Subject<'_>) -> Vec<String> {
        let found = find_all(&self.fields, s.fields);
        let label = self.fields.iter().map(Selector::as_str).collect::<Vec<_>>().join(", ");
        let mut out = Vec::new();
        bound(&mut out, &label, found.len() as f64, self.items, "item(s)");
        let w: Vec<f64> = found.iter().map(|f| text::word_units(&f.text) as f64).collect();
        let c: Vec<f64> = found.iter().map(|f| f.text.chars().count() as f64).collect();
        match self.over.as_str() {
            "each" => {
                for (i, f) in found.iter().enumerate() {
                    bound(&mut out, &f.at, w[i], self.words, "words");
                    bound(&mut out, &f.at, c[i], self.chars, "characters");
                }
            }
            over => {
                if found.is_empty() {
                    return out;
                }
                let agg = |v: &[f64]| {
                    let sum: f64 = v.iter().sum();
                    if over == "mean" { sum / v.len() as f64 } else { sum }
                };
                let what = format!("{label} ({over} over {} texts)", found.len());
                bound(&mut out, &what, agg(&w), self.words, "words");
                bound(&mut out, &what, agg(&c), self.chars, "characters");
            }
        }
        out
    }
    fn columns(&self) -> Vec<String> {
        columns_of(&self.fields)
    }
}

// -------------------------------------------------------------------- chat

pub static CHAT: CheckKind = CheckKind {
    name: "chat",
    about: "chat rules of a list of turns: speakers alternate, who speaks first (fixed, or per record from a column), the number of turns",
    options: &[
        OptionSpec::default("field", Ty::Str, "\"turns\"", "the list of turns ({role, content} items)"),
        OptionSpec::default("role_key", Ty::Str, "\"role\"", "the key naming a turn's speaker"),
        OptionSpec::default("alternate", Ty::Bool, "true", "no speaker talks twice in a row (a system turn aside)"),
        OptionSpec::default(
            "first",
            Ty::Enum(&["any", "user", "assistant"]),
            "\"any\"",
            "who speaks first (after a system turn)",
        ),
        OptionSpec::optional(
            "first_column",
            Ty::Str,
            "a column of the record saying who speaks first: \"user\", \"role\"/\"assistant\" or \"any\" (overrides `first`)",
        ),
        OptionSpec::optional("min_turns", UINT, "fewest turns (a system turn aside)"),
        OptionSpec::optional("max_turns", UINT, "most turns (a system turn aside)"),
    ],
    build: |v, _env| {
        #[derive(Deserialize)]
        struct O {
            #[serde(default)]
            field: Option<String>,
            #[serde(default)]
            role_key: Option<String>,
            #[serde(default)]
            alternate: Option<bool>,
            #[serde(default)]
            first: Option<String>,
            first_column: Option<String>,
            min_turns: Option<usize>,
            max_turns: Option<usize>,
        }
        let o: O = options(v)?;
        Ok(Box::new(Chat {
            field: o.field.unwrap_or_else(|| "turns".into()),
            role_key: o.role_key.unwrap_or_else(|| "role".into()),
            alternate: o.alternate.unwrap_or(true),
            first: o.first.unwrap_or_else(|| "any".into()),
            first_column: o.first_column,
            turns: (o.min_turns, o.max_turns),
        }))
    },
};

struct Chat {
    field: String,
    role_key: String,
    alternate: bool,
    first: String,
    first_column: Option<String>,
    turns: (Option<usize>, Option<usize>),
}

/// `user`, `assistant` (also `role`, a role's name column aside) or `system`.
fn speaker(role: &str) -> &'static str {
    match role.trim().to_ascii_lowercase().as_str() {
        "user" | "human" => "user",
        "system" => "system",
        _ => "assistant",
    }
}

impl Check for Chat {
    fn problems(&self, s: &Subject<'_>) -> Vec<String> {
        let Some(turns) = s.fields.get(&self.field).and_then(Value::as_array) else {
            return vec![format!("{} is not a list of turns", self.field)];
        };
        let who: Vec<&'static str> = turns
            .iter()
            .map(|t| speaker(t.get(&self.role_key).and_then(Value::as_str).unwrap_or_default()))
            .filter(|w| *w != "system")
            .collect();
        let mut out = Vec::new();
        bound(&mut out, &self.field, who.len() as f64, self.turns, "turns");
        if self.alternate
            && let Some(i) = who.windows(2).position(|w| w[0] == w[1])
        {
            out.push(format!(
                "in {}, the {} speaks twice in a row (turns {} and {}); turns must alternate",
                self.field,
                who[i],
                i + 1,
                i + 2
            ));
        }
        let first = match self.first_column.as_deref().and_then(|c| s.record.get(c)).and_then(Value::as_str) {
            Some("role") | Some("assistant") => "assistant",
            Some("user") => "user",
            Some(_) => "any",
            None => self.first.as_str(),
        };
        if let Some(got) = who.first()
            && first != "any"
            && *got != first
        {
            let name = |w: &str| if w == "user" { "the user" } else { "the role" };
            out.push(format!("the dialogue must begin with {}, not {}", name(first), name(got)));
        }
        out
    }
    fn columns(&self) -> Vec<String> {
        vec![self.field.clone()]
    }
}
