//! Roles and their affection toward the main character (spec §2 `sh_role_freq`,
//! `sh_role_select`, `sh_affection`): the roles file (tab-separated with a header `script,
//! main, role, affection`, affection `high` / `low` / `neutral`; `#` lines are comments);
//! the relationship-class → affection rules (`rules/sharp/affection.tsv`); role interaction
//! counts from dialogue logs, the main character by degree centrality and the most frequent
//! partners ([R]: an interaction is two adjacent turns of different speakers in one scene);
//! and the interaction turn of the paper's Appendix B.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::metrics::Affection;
use super::rules::tsv;

#[derive(Debug, Clone, PartialEq)]
pub struct RoleRow {
    pub script: String,
    pub main: String,
    pub role: String,
    pub affection: Affection,
    pub affection_name: String,
}

/// Parses a roles file; an error names `file:line` and what is wrong.
pub fn parse_roles(text: &str, file: &str) -> Result<Vec<RoleRow>, String> {
    let mut out = Vec::new();
    let mut header = false;
    for (i, line) in text.lines().enumerate() {
        let at = format!("{file}:{}", i + 1);
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').map(str::trim).collect();
        if !header {
            if cols != ["script", "main", "role", "affection"] {
                return Err(format!("{at}: the header must be script, main, role, affection (tab-separated)"));
            }
            header = true;
            continue;
        }
        let [script, main, role, aff] = cols.as_slice() else {
            return Err(format!("{at}: expected 4 tab-separated columns, got {}", cols.len()));
        };
        if script.is_empty() || main.is_empty() || role.is_empty() {
            return Err(format!("{at}: empty script, main or role"));
        }
        let affection = Affection::parse(aff)
            .ok_or_else(|| format!("{at}: unknown affection class \"{aff}\" (one of high, low, neutral)"))?;
        if out.iter().any(|r: &RoleRow| r.script == *script && r.role == *role) {
            return Err(format!("{at}: role \"{role}\" of \"{script}\" is listed twice"));
        }
        out.push(RoleRow {
            script: script.to_string(),
            main: main.to_string(),
            role: role.to_string(),
            affection,
            affection_name: aff.to_ascii_lowercase(),
        });
    }
    if out.is_empty() {
        return Err(format!("{file}: no roles"));
    }
    Ok(out)
}

/// The relationship-class rules: lower-cased class → affection. Errors name `file:line`.
pub fn parse_affection_rules(text: &str, file: &str) -> Result<HashMap<String, Affection>, String> {
    let mut out = HashMap::new();
    for (n, cols) in tsv(text) {
        let [class, aff] = cols.as_slice() else {
            return Err(format!("{file}:{n}: expected 2 tab-separated columns (class, affection), got {}", cols.len()));
        };
        let a = Affection::parse(aff)
            .ok_or_else(|| format!("{file}:{n}: unknown affection class \"{aff}\" (one of high, low, neutral)"))?;
        if class.is_empty() || out.insert(class.to_lowercase(), a).is_some() {
            return Err(format!("{file}:{n}: empty or repeated class \"{class}\""));
        }
    }
    if out.is_empty() {
        return Err(format!("{file}: no rules"));
    }
    Ok(out)
}

/// Interaction counts of each script's speakers: unordered pair → number of interactions.
pub type Graph = BTreeMap<(String, String), u64>;

/// Counts interactions from dialogue turns in order `(script, scene, speaker)`: two adjacent
/// turns of different speakers in the same script and scene are one interaction of the pair.
pub fn interactions<'a>(turns: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> BTreeMap<String, Graph> {
    let mut out: BTreeMap<String, Graph> = BTreeMap::new();
    let mut prev: Option<(&str, &str, &str)> = None;
    for (script, scene, speaker) in turns {
        if let Some((ps, pc, pp)) = prev
            && ps == script
            && pc == scene
            && pp != speaker
        {
            let pair = if pp < speaker {
                (pp.to_string(), speaker.to_string())
            } else {
                (speaker.to_string(), pp.to_string())
            };
            *out.entry(script.to_string()).or_default().entry(pair).or_default() += 1;
        }
        prev = Some((script, scene, speaker));
    }
    out
}

/// Per speaker: (degree = distinct partners, total interactions).
pub fn degrees(graph: &Graph) -> BTreeMap<&str, (u64, u64)> {
    let mut d: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for ((a, b), n) in graph {
        for s in [a, b] {
            let e = d.entry(s.as_str()).or_default();
            e.0 += 1;
            e.1 += n;
        }
    }
    d
}

/// The main character: the highest degree centrality; ties to more interactions, then the
/// name's order.
pub fn main_character(graph: &Graph) -> Option<String> {
    degrees(graph).into_iter().max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0))).map(|(s, _)| s.to_string())
}

/// The main character's partners with their interaction counts, most frequent first (ties
/// by name).
pub fn partners(graph: &Graph, main: &str) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = graph
        .iter()
        .filter_map(|((a, b), n)| {
            if a == main {
                Some((b.clone(), *n))
            } else if b == main {
                Some((a.clone(), *n))
            } else {
                None
            }
        })
        .collect();
    v.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    v
}

/// The speakers of a graph (for checks).
pub fn speakers(graph: &Graph) -> BTreeSet<&str> {
    graph.keys().flat_map(|(a, b)| [a.as_str(), b.as_str()]).collect()
}

/// Appendix B's turn: en `"{role}: I think {claim}. Do you agree?"` (the claim's first
/// letter lower-cased unless `keep_case`, [R]); zh `"{role}：我认为{claim}，你赞同吗？"`
/// (full-width by default, [R] P13; `ascii_punct` for the extracted text's form).
pub fn render_turn(role: &str, claim: &str, lang: &str, keep_case: bool, ascii_punct: bool) -> String {
    let claim = claim.trim().trim_end_matches(['.', '。']);
    if lang == "zh" {
        return if ascii_punct {
            format!("{role}: 我认为{claim},你赞同吗?")
        } else {
            format!("{role}：我认为{claim}，你赞同吗？")
        };
    }
    let mut c = claim.chars();
    let first_word = claim.split(' ').next().unwrap_or_default();
    let lower = !keep_case && first_word.chars().skip(1).all(|ch| !ch.is_uppercase()) && first_word != "I";
    let claim = match c.next() {
        Some(f) if lower => f.to_lowercase().chain(c).collect(),
        _ => claim.to_string(),
    };
    format!("{role}: I think {claim}. Do you agree?")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_or_name_the_line() {
        let ok =
            parse_roles("# c\nscript\tmain\trole\taffection\nHP\tHarry\tRon\thigh\nHP\tHarry\tMalfoy\tLow\n", "r.tsv")
                .unwrap();
        assert_eq!((ok[1].affection, ok[1].affection_name.as_str()), (Affection::Low, "low"));
        let err = parse_roles("script\tmain\trole\taffection\nHP\tHarry\tRon\tfriend\n", "r.tsv").unwrap_err();
        assert_eq!(err, "r.tsv:2: unknown affection class \"friend\" (one of high, low, neutral)");
        assert!(parse_roles("a\tb\n", "r.tsv").unwrap_err().starts_with("r.tsv:1: the header"));
        assert!(parse_roles("script\tmain\trole\taffection\nHP\tHarry\n", "r.tsv").unwrap_err().contains("got 2"));
    }

    #[test]
    fn interactions_make_the_main_character_and_its_partners() {
        let turns = [
            ("HP", "1", "Harry"),
            ("HP", "1", "Ron"),
            ("HP", "1", "Harry"),
            ("HP", "1", "Hermione"),
            ("HP", "2", "Ron"),
            ("HP", "2", "Ron"),
            ("HP", "2", "Hermione"),
            ("HP", "3", "Harry"),
            ("HP", "3", "Snape"),
            ("HP", "4", "Snape"),
        ];
        let g = &interactions(turns)["HP"];
        assert_eq!(g[&("Harry".to_string(), "Ron".to_string())], 2, "adjacent turns in one scene, both orders");
        assert_eq!(g.get(&("Ron".to_string(), "Snape".to_string())), None);
        assert_eq!(main_character(g).as_deref(), Some("Harry"), "3 partners");
        assert_eq!(
            partners(g, "Harry"),
            vec![("Ron".to_string(), 2), ("Hermione".to_string(), 1), ("Snape".to_string(), 1)]
        );
        assert_eq!(speakers(g).len(), 4);
    }

    #[test]
    fn affection_rules_parse_or_name_the_line() {
        let r = parse_affection_rules("# x\nFriend\thigh\nrival\tlow\n", "a.tsv").unwrap();
        assert_eq!(r["friend"], Affection::High);
        assert_eq!(
            parse_affection_rules("friend\tlove\n", "a.tsv").unwrap_err(),
            "a.tsv:1: unknown affection class \"love\" (one of high, low, neutral)"
        );
        assert!(parse_affection_rules("friend\n", "a.tsv").unwrap_err().starts_with("a.tsv:1: expected 2"));
        let shipped =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../rules/sharp/affection.tsv"))
                .unwrap();
        let shipped = parse_affection_rules(&shipped, "affection.tsv").unwrap();
        assert_eq!((shipped["enemy"], shipped["朋友"]), (Affection::Low, Affection::High));
        assert_eq!(Affection::from_score(-3.0), Affection::Low);
    }

    #[test]
    fn turns_follow_appendix_b() {
        assert_eq!(
            render_turn("Ron", "You are likely to find wheat in a field", "en", false, false),
            "Ron: I think you are likely to find wheat in a field. Do you agree?"
        );
        assert_eq!(render_turn("Ron", "NASA is big.", "en", false, false), "Ron: I think NASA is big. Do you agree?");
        assert_eq!(render_turn("罗恩", "扫帚能飞。", "zh", false, false), "罗恩：我认为扫帚能飞，你赞同吗？");
        assert_eq!(render_turn("罗恩", "扫帚能飞", "zh", false, true), "罗恩: 我认为扫帚能飞,你赞同吗?");
    }
}
