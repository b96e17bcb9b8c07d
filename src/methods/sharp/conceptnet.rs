//! ConceptNet assertion lines (the official 5-column tab-separated dump: assertion URI,
//! relation, start node, end node, JSON info) as edges, the claim filter of the spec
//! (`../shared/specs/sharp.md` §2, `sh_kg_filter`: language on both ends, relation
//! whitelist, weight threshold, surface text) and claim rendering from the surface text
//! (`[[`/`]]` removed, a leading `*` stripped; zh: spaces between CJK characters dropped).
//! Pure: the streaming source is `super::stages::claims`.

use serde_json::Value;

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

/// One assertion line.
#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    pub uri: String,
    /// The relation's name without `/r/` (`AtLocation`; `dbpedia/genre` for `/r/dbpedia/genre`).
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

/// `(lang, term)` of a concept URI `/c/{lang}/{term}[/…]`.
pub fn concept(uri: &str) -> (Option<String>, Option<String>) {
    let mut parts = uri.strip_prefix("/c/").map(|r| r.split('/'));
    match parts.as_mut() {
        Some(p) => {
            let lang = p.next().filter(|s| !s.is_empty()).map(str::to_string);
            let term = p.next().filter(|s| !s.is_empty()).map(str::to_string);
            (lang, term)
        }
        None => (None, None),
    }
}

/// Parses one line (without its newline). The error says what is wrong; the caller adds
/// `file:line`.
pub fn parse_line(line: &str) -> Result<Edge, String> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let cols: Vec<&str> = line.split('\t').collect();
    if cols.len() != 5 {
        return Err(format!("expected 5 tab-separated columns (uri, relation, start, end, JSON), got {}", cols.len()));
    }
    let rel = cols[1]
        .strip_prefix("/r/")
        .ok_or_else(|| format!("column 2 is not a relation URI (/r/…): \"{}\"", cols[1]))?;
    let info: Value = serde_json::from_str(cols[4]).map_err(|e| format!("column 5 is not valid JSON: {e}"))?;
    let Value::Object(info) = info else {
        return Err("column 5 is JSON but not an object".into());
    };
    let text = |k: &str| info.get(k).and_then(Value::as_str).map(str::to_string);
    let weight = match info.get("weight") {
        Some(w) => w.as_f64().ok_or_else(|| format!("column 5: \"weight\" is not a number: {w}"))?,
        None => return Err("column 5 has no \"weight\"".into()),
    };
    let (lang_start, term_start) = concept(cols[2]);
    let (lang_end, term_end) = concept(cols[3]);
    Ok(Edge {
        uri: cols[0].to_string(),
        rel: rel.to_string(),
        start: cols[2].to_string(),
        end: cols[3].to_string(),
        lang_start,
        lang_end,
        term_start,
        term_end,
        dataset: text("dataset"),
        license: text("license"),
        weight,
        surface_text: text("surfaceText"),
        surface_start: text("surfaceStart"),
        surface_end: text("surfaceEnd"),
    })
}

/// The claim filter's settings (spec §2 defaults via [`Filter::default`]).
#[derive(Debug, Clone)]
pub struct Filter {
    pub lang: String,
    pub relations: Vec<String>,
    pub min_weight: f64,
    /// Without it, an edge with no surface text is rendered from a relation template.
    pub require_surface: bool,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            lang: "en".into(),
            relations: DEFAULT_RELATIONS.iter().map(|s| s.to_string()).collect(),
            min_weight: 1.0,
            require_surface: true,
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
    /// The claim text for a kept edge, or why it is dropped.
    pub fn claim(&self, e: &Edge) -> Result<String, Drop> {
        if e.lang_start.as_deref() != Some(self.lang.as_str()) || e.lang_end.as_deref() != Some(self.lang.as_str()) {
            return Err(Drop::Language);
        }
        if !self.relations.contains(&e.rel) {
            return Err(Drop::Relation);
        }
        if e.weight < self.min_weight {
            return Err(Drop::Weight);
        }
        match &e.surface_text {
            Some(s) if !render_surface(s, &self.lang).is_empty() => Ok(render_surface(s, &self.lang)),
            _ if self.require_surface => Err(Drop::NoSurface),
            _ => template(e).ok_or(Drop::NoTemplate),
        }
    }
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x3000..=0x303F | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0xFF00..=0xFFEF)
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

/// The spec's [R] relation templates for an edge without surface text (terms: `_` → space).
pub fn template(e: &Edge) -> Option<String> {
    let s = e.term_start.as_deref()?.replace('_', " ");
    let o = e.term_end.as_deref()?.replace('_', " ");
    let t = match e.rel.as_str() {
        "IsA" => format!("{s} is a type of {o}"),
        "UsedFor" => format!("{s} is used for {o}"),
        "AtLocation" => format!("You are likely to find {s} in {o}"),
        "CapableOf" => format!("{s} can {o}"),
        "HasProperty" => format!("{s} is {o}"),
        "PartOf" => format!("{s} is part of {o}"),
        "HasA" => format!("{s} has {o}"),
        "Causes" => format!("{s} causes {o}"),
        "MadeOf" => format!("{s} is made of {o}"),
        "Desires" => format!("{s} wants {o}"),
        _ => return None,
    };
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHEAT: &str = "/a/[/r/AtLocation/,/c/en/wheat/,/c/en/field/]\t/r/AtLocation\t/c/en/wheat\t/c/en/field\t{\"dataset\": \"/d/conceptnet/4/en\", \"license\": \"cc:by/4.0\", \"sources\": [], \"surfaceText\": \"You are likely to find [[wheat]] in [[a field]]\", \"weight\": 2.0}";

    #[test]
    fn a_line_parses_into_an_edge() {
        let e = parse_line(WHEAT).unwrap();
        assert_eq!((e.rel.as_str(), e.weight), ("AtLocation", 2.0));
        assert_eq!((e.lang_start.as_deref(), e.term_end.as_deref()), (Some("en"), Some("field")));
        assert_eq!(e.dataset.as_deref(), Some("/d/conceptnet/4/en"));
        assert_eq!(Filter::default().claim(&e).unwrap(), "You are likely to find wheat in a field");
        let url = parse_line("/a/x\t/r/ExternalURL\t/c/en/test\thttp://dbpedia.org/x\t{\"weight\": 1.0}").unwrap();
        assert_eq!((url.lang_end, url.term_end), (None, None));
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        assert!(parse_line("a\tb\tc").unwrap_err().contains("got 3"));
        let bad = WHEAT.replace("{\"dataset\"", "{dataset");
        assert!(parse_line(&bad).unwrap_err().contains("column 5 is not valid JSON"));
        assert!(parse_line("/a/x\t/r/IsA\t/c/en/a\t/c/en/b\t[1]").unwrap_err().contains("not an object"));
        assert!(parse_line("/a/x\t/r/IsA\t/c/en/a\t/c/en/b\t{}").unwrap_err().contains("no \"weight\""));
        assert!(parse_line("/a/x\tIsA\t/c/en/a\t/c/en/b\t{}").unwrap_err().contains("relation URI"));
    }

    #[test]
    fn the_filter_drops_with_a_reason() {
        let f = Filter::default();
        let e = parse_line(WHEAT).unwrap();
        let with = |g: &dyn Fn(&mut Edge)| {
            let mut x = e.clone();
            g(&mut x);
            f.claim(&x)
        };
        assert_eq!(with(&|x| x.lang_end = Some("fr".into())), Err(Drop::Language));
        assert_eq!(with(&|x| x.rel = "RelatedTo".into()), Err(Drop::Relation));
        assert_eq!(with(&|x| x.weight = 0.5), Err(Drop::Weight));
        assert_eq!(with(&|x| x.surface_text = None), Err(Drop::NoSurface));
        let loose = Filter { require_surface: false, ..Filter::default() };
        let mut x = e.clone();
        x.surface_text = None;
        assert_eq!(loose.claim(&x).unwrap(), "You are likely to find wheat in field");
    }

    #[test]
    fn surface_texts_render() {
        assert_eq!(render_surface("*[[經理來訪]] 可能代表 [[檢查]] 。", "zh"), "經理來訪可能代表檢查。");
        assert_eq!(render_surface("[[assay]] is a type of [[test]]", "en"), "assay is a type of test");
        assert_eq!(render_surface("[[a]] 是 [[b c]]", "zh"), "a 是 b c");
    }
}
