//! ConceptNet assertion lines (the official 5-column tab-separated dump: assertion URI,
//! relation, start node, end node, JSON info) as edges, the claim filter of the spec
//! (`../shared/specs/sharp.md` §2, `sh_kg_filter`: language on both ends, relation
//! whitelist, weight threshold, surface text) and claim rendering from the surface text
//! (`[[`/`]]` removed, a leading `*` stripped; zh: spaces between CJK characters dropped and
//! Traditional → Simplified, [`super::text`]) or from a relation template of the rules folder.
//! Lines are split without copying and filtered on the cheap columns first
//! ([`split`], [`Filter::quick`]); the JSON column is still checked on every line.
//! Pure: the streaming source is `super::stages::claims`.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::rules::Rules;
use super::text::{is_cjk, zh_convert};

/// The spec's [R] whitelist of "commonsense, objective" OMCS relations.
pub const DEFAULT_RELATIONS: &[&str] = &[
    "IsA",
    "UsedFor",
    "AtLocation",
    "CapableOf",
    "HasProperty",
    "PartOf",
    "HasA",
    "Causes",
    "Desires",
    "MadeOf",
    "HasSubevent",
    "HasPrerequisite",
    "ReceivesAction",
    "CreatedBy",
    "MotivatedByGoal",
    "CausesDesire",
    "LocatedNear",
];

/// The five columns of a line, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    pub uri: &'a str,
    /// The relation's name without `/r/` (`AtLocation`; `dbpedia/genre` for `/r/dbpedia/genre`).
    pub rel: &'a str,
    pub start: &'a str,
    pub end: &'a str,
    pub info: &'a str,
}

/// The JSON column, borrowed where it has no escapes.
#[derive(Deserialize)]
pub struct Info<'a> {
    #[serde(borrow, default)]
    pub dataset: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub license: Option<Cow<'a, str>>,
    #[serde(default)]
    pub weight: Option<serde_json::Value>,
    #[serde(borrow, default, rename = "surfaceText")]
    pub surface_text: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "surfaceStart")]
    pub surface_start: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "surfaceEnd")]
    pub surface_end: Option<Cow<'a, str>>,
}

/// One assertion, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    pub uri: String,
    pub rel: String,
    pub start: String,
    pub end: String,
    /// The 3rd path segment of a `/c/{lang}/…` node; `None` for a URL or another node type.
    pub lang_start: Option<String>,
    pub lang_end: Option<String>,
    pub term_start: Option<String>,
    pub term_end: Option<String>,
    pub dataset: Option<String>,
    pub license: Option<String>,
    pub weight: f64,
    pub surface_text: Option<String>,
    pub surface_start: Option<String>,
    pub surface_end: Option<String>,
}

/// `(lang, term)` of a concept URI `/c/{lang}/{term}[/…]`, borrowed.
pub fn concept(uri: &str) -> (Option<&str>, Option<&str>) {
    let mut parts = uri.strip_prefix("/c/").map(|r| r.split('/'));
    match parts.as_mut() {
        Some(p) => {
            let lang = p.next().filter(|s| !s.is_empty());
            let term = p.next().filter(|s| !s.is_empty());
            (lang, term)
        }
        None => (None, None),
    }
}

/// The columns of one line (without its newline). The error says what is wrong; the
/// caller adds `file:line`.
pub fn split(line: &str) -> Result<Line<'_>, String> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut it = line.splitn(6, '\t');
    let cols: [Option<&str>; 6] = std::array::from_fn(|_| it.next());
    let (Some(uri), Some(rel), Some(start), Some(end), Some(info), None) =
        (cols[0], cols[1], cols[2], cols[3], cols[4], cols[5])
    else {
        let n = line.split('\t').count();
        return Err(format!("expected 5 tab-separated columns (uri, relation, start, end, JSON), got {n}"));
    };
    let rel = rel.strip_prefix("/r/").ok_or_else(|| format!("column 2 is not a relation URI (/r/…): \"{rel}\""))?;
    Ok(Line { uri, rel, start, end, info })
}

/// Why column 5 is not a usable JSON object.
fn json_error(info: &str, typed: Option<serde_json::Error>) -> String {
    match serde_json::from_str::<IgnoredAny>(info) {
        Err(e) => format!("column 5 is not valid JSON: {e}"),
        Ok(_) if !info.trim_start().starts_with('{') => "column 5 is JSON but not an object".into(),
        Ok(_) => format!("column 5: {}", typed.map(|e| e.to_string()).unwrap_or_default()),
    }
}

/// Checks that column 5 is a JSON object without building it (for lines the filter drops).
pub fn check_info(line: &Line<'_>) -> Result<(), String> {
    if line.info.trim_start().starts_with('{') && serde_json::from_str::<IgnoredAny>(line.info).is_ok() {
        return Ok(());
    }
    Err(json_error(line.info, None))
}

/// Column 5 read; `weight` must be a number.
pub fn info<'a>(line: &Line<'a>) -> Result<(Info<'a>, f64), String> {
    if !line.info.trim_start().starts_with('{') {
        return Err(json_error(line.info, None));
    }
    let info: Info<'a> = serde_json::from_str(line.info).map_err(|e| json_error(line.info, Some(e)))?;
    let weight = match &info.weight {
        Some(w) => w.as_f64().ok_or_else(|| format!("column 5: \"weight\" is not a number: {w}"))?,
        None => return Err("column 5 has no \"weight\"".into()),
    };
    Ok((info, weight))
}

impl Edge {
    pub fn new(line: &Line<'_>, info: &Info<'_>, weight: f64) -> Edge {
        let (lang_start, term_start) = concept(line.start);
        let (lang_end, term_end) = concept(line.end);
        let own = |c: &Option<Cow<'_, str>>| c.as_deref().map(str::to_string);
        Edge {
            uri: line.uri.to_string(),
            rel: line.rel.to_string(),
            start: line.start.to_string(),
            end: line.end.to_string(),
            lang_start: lang_start.map(str::to_string),
            lang_end: lang_end.map(str::to_string),
            term_start: term_start.map(str::to_string),
            term_end: term_end.map(str::to_string),
            dataset: own(&info.dataset),
            license: own(&info.license),
            weight,
            surface_text: own(&info.surface_text),
            surface_start: own(&info.surface_start),
            surface_end: own(&info.surface_end),
        }
    }
}

/// Parses one whole line into an edge.
pub fn parse_line(line: &str) -> Result<Edge, String> {
    let l = split(line)?;
    let (info, weight) = info(&l)?;
    Ok(Edge::new(&l, &info, weight))
}

/// The claim filter's settings (spec §2 defaults via [`Filter::default`]).
#[derive(Debug, Clone)]
pub struct Filter {
    pub lang: String,
    pub relations: Vec<String>,
    pub min_weight: f64,
    /// Without it, an edge with no surface text is rendered from a relation template.
    pub require_surface: bool,
    /// How Chinese claims are converted ([`super::text::ZH_CONVERSIONS`]).
    pub zh_convert: String,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            lang: "en".into(),
            relations: DEFAULT_RELATIONS.iter().map(|s| s.to_string()).collect(),
            min_weight: 1.0,
            require_surface: true,
            zh_convert: "t2s".into(),
        }
    }
}

/// Why an edge is not a claim (counted by the source; only `NoSurface` is a record's fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Drop {
    Language,
    Relation,
    Weight,
    NoSurface,
    NoTemplate,
}

impl Drop {
    pub fn name(self) -> &'static str {
        match self {
            Drop::Language => "language",
            Drop::Relation => "relation",
            Drop::Weight => "weight",
            Drop::NoSurface => "no surface text",
            Drop::NoTemplate => "no surface text and no template for the relation",
        }
    }
}

impl Filter {
    /// The drops decided by the cheap columns: language of both ends, then the relation.
    pub fn quick(&self, l: &Line<'_>) -> Result<(), Drop> {
        if concept(l.start).0 != Some(self.lang.as_str()) || concept(l.end).0 != Some(self.lang.as_str()) {
            return Err(Drop::Language);
        }
        if !self.relations.iter().any(|r| r == l.rel) {
            return Err(Drop::Relation);
        }
        Ok(())
    }

    /// The claim text for a kept edge, or why it is dropped.
    pub fn claim(&self, e: &Edge, rules: &Rules) -> Result<String, Drop> {
        if e.lang_start.as_deref() != Some(self.lang.as_str()) || e.lang_end.as_deref() != Some(self.lang.as_str()) {
            return Err(Drop::Language);
        }
        if !self.relations.contains(&e.rel) {
            return Err(Drop::Relation);
        }
        if e.weight < self.min_weight {
            return Err(Drop::Weight);
        }
        let rendered = e.surface_text.as_deref().map(|s| render_surface(s, &self.lang)).filter(|s| !s.is_empty());
        let claim = match rendered {
            Some(s) => s,
            None if self.require_surface => return Err(Drop::NoSurface),
            None => template(e, rules).ok_or(Drop::NoTemplate)?,
        };
        Ok(self.script(&claim))
    }

    /// A text of the claims' language in their script (Chinese: converted).
    pub fn script(&self, text: &str) -> String {
        if self.lang == "zh" { zh_convert(text, &self.zh_convert) } else { text.to_string() }
    }
}

/// A surface text as a claim: `[[`/`]]` removed, a leading `*` stripped, trimmed; for
/// `zh`, spaces between CJK characters (and before `。`) removed.
pub fn render_surface(surface: &str, lang: &str) -> String {
    let s = surface.replace("[[", "").replace("]]", "");
    let s = s.trim().trim_start_matches('*').trim().to_string();
    if lang != "zh" {
        return s;
    }
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    for (i, &c) in chars.iter().enumerate() {
        if c == ' ' {
            let prev = out.chars().last();
            let next = chars[i + 1..].iter().find(|c| **c != ' ').copied();
            if prev.is_some_and(is_cjk) && next.is_some_and(is_cjk) || next.is_none() {
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// The relation template of the rules folder for an edge without surface text (terms:
/// `_` → space).
pub fn template(e: &Edge, rules: &Rules) -> Option<String> {
    let s = e.term_start.as_deref()?.replace('_', " ");
    let o = e.term_end.as_deref()?.replace('_', " ");
    Some(rules.templates.get(&e.rel)?.replace("{start}", &s).replace("{end}", &o))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHEAT: &str = "/a/[/r/AtLocation/,/c/en/wheat/,/c/en/field/]\t/r/AtLocation\t/c/en/wheat\t/c/en/field\t{\"dataset\": \"/d/conceptnet/4/en\", \"license\": \"cc:by/4.0\", \"sources\": [], \"surfaceText\": \"You are likely to find [[wheat]] in [[a field]]\", \"weight\": 2.0}";

    fn rules() -> Rules {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../..")).join("rules/sharp");
        Rules::load(&dir, "rules/sharp", "en").unwrap()
    }

    #[test]
    fn a_line_parses_into_an_edge() {
        let e = parse_line(WHEAT).unwrap();
        assert_eq!((e.rel.as_str(), e.weight), ("AtLocation", 2.0));
        assert_eq!((e.lang_start.as_deref(), e.term_end.as_deref()), (Some("en"), Some("field")));
        assert_eq!(e.dataset.as_deref(), Some("/d/conceptnet/4/en"));
        assert_eq!(Filter::default().claim(&e, &rules()).unwrap(), "You are likely to find wheat in a field");
        let url = parse_line("/a/x\t/r/ExternalURL\t/c/en/test\thttp://dbpedia.org/x\t{\"weight\": 1.0}").unwrap();
        assert_eq!((url.lang_end, url.term_end), (None, None));
        let escaped =
            parse_line("/a/x\t/r/IsA\t/c/en/a\t/c/en/b\t{\"surfaceText\": \"[[a]] is \\\"b\\\"\", \"weight\": 1}")
                .unwrap();
        assert_eq!(escaped.surface_text.as_deref(), Some("[[a]] is \"b\""));
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        assert!(parse_line("a\tb\tc").unwrap_err().contains("got 3"));
        assert!(parse_line("a\tb\tc\td\te\tf").unwrap_err().contains("got 6"));
        let bad = WHEAT.replace("{\"dataset\"", "{dataset");
        assert!(parse_line(&bad).unwrap_err().contains("column 5 is not valid JSON"));
        assert!(check_info(&split(&bad).unwrap()).unwrap_err().contains("column 5 is not valid JSON"));
        assert!(parse_line("/a/x\t/r/IsA\t/c/en/a\t/c/en/b\t[1]").unwrap_err().contains("not an object"));
        assert!(
            check_info(&split("/a/x\t/r/IsA\t/c/en/a\t/c/en/b\t[1]").unwrap()).unwrap_err().contains("not an object")
        );
        assert!(parse_line("/a/x\t/r/IsA\t/c/en/a\t/c/en/b\tnope").unwrap_err().contains("not valid JSON"));
        assert!(parse_line("/a/x\t/r/IsA\t/c/en/a\t/c/en/b\t{}").unwrap_err().contains("no \"weight\""));
        assert!(
            parse_line("/a/x\t/r/IsA\t/c/en/a\t/c/en/b\t{\"weight\": \"1\"}").unwrap_err().contains("not a number")
        );
        assert!(parse_line("/a/x\tIsA\t/c/en/a\t/c/en/b\t{}").unwrap_err().contains("relation URI"));
    }

    #[test]
    fn the_filter_drops_with_a_reason() {
        let (f, r) = (Filter::default(), rules());
        let e = parse_line(WHEAT).unwrap();
        let with = |g: &dyn Fn(&mut Edge)| {
            let mut x = e.clone();
            g(&mut x);
            f.claim(&x, &r)
        };
        assert_eq!(with(&|x| x.lang_end = Some("fr".into())), Err(Drop::Language));
        assert_eq!(with(&|x| x.rel = "RelatedTo".into()), Err(Drop::Relation));
        assert_eq!(with(&|x| x.weight = 0.5), Err(Drop::Weight));
        assert_eq!(with(&|x| x.surface_text = None), Err(Drop::NoSurface));
        let loose = Filter { require_surface: false, ..Filter::default() };
        let mut x = e.clone();
        x.surface_text = None;
        assert_eq!(loose.claim(&x, &r).unwrap(), "You are likely to find wheat in field");
        x.rel = "LocatedNear".into();
        let near = Filter { relations: vec!["LocatedNear".into()], ..loose.clone() };
        assert_eq!(near.claim(&x, &r).unwrap(), "wheat is typically near field");
        let l = split(WHEAT).unwrap();
        assert_eq!(f.quick(&l), Ok(()));
        assert_eq!(Filter { lang: "zh".into(), ..Filter::default() }.quick(&l), Err(Drop::Language));
    }

    #[test]
    fn surface_texts_render() {
        assert_eq!(render_surface("*[[經理來訪]] 可能代表 [[檢查]] 。", "zh"), "經理來訪可能代表檢查。");
        assert_eq!(render_surface("[[assay]] is a type of [[test]]", "en"), "assay is a type of test");
        assert_eq!(render_surface("[[a]] 是 [[b c]]", "zh"), "a 是 b c");
        let zh = Filter { lang: "zh".into(), ..Filter::default() };
        assert_eq!(zh.script("經理來訪可能代表檢查。"), "经理来访可能代表检查。");
        let keep = Filter { zh_convert: "none".into(), ..zh };
        assert_eq!(keep.script("檢查"), "檢查");
    }
}
