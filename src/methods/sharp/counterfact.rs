//! Rule-based counterfactual claims (spec §2 `sh_counterfact`; the paper names the rule
//! families only: "adding negatives or absolute qualifiers to factual statements,
//! converting entities to antonyms, and disrupting entity relationships"). The
//! operationalization is [R]: `negation` negates the relation phrase, `absolute_qualifier`
//! adds "only", `antonym` swaps the first word with an entry in `rules/sharp/antonyms.tsv`,
//! `relation_disruption` swaps the two concepts of the surface text. English claims only;
//! a rule that does not apply to a claim returns `None`. Drafts: the paper checked each
//! counterfactual by hand.

use std::collections::HashMap;
use std::sync::LazyLock;

const ANTONYMS: &str = include_str!("../../../rules/sharp/antonyms.tsv");

/// The rules, in their default order.
pub const RULES: &[&str] = &["negation", "absolute_qualifier", "antonym", "relation_disruption"];

static LEXICON: LazyLock<HashMap<String, String>> = LazyLock::new(|| {
    let mut m = HashMap::new();
    for line in ANTONYMS.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if let Some((a, b)) = line.split_once('\t') {
            m.entry(a.trim().to_string()).or_insert_with(|| b.trim().to_string());
            m.entry(b.trim().to_string()).or_insert_with(|| a.trim().to_string());
        }
    }
    m
});

/// (phrase, negated, qualified): relation phrases of ConceptNet's English surface texts.
const PHRASES: &[(&str, &str, &str)] = &[
    ("You are likely to find ", "You are unlikely to find ", "You can only find "),
    ("You can use ", "You cannot use ", "You can only use "),
    (" is a type of ", " is not a type of ", " is only a type of "),
    (" is used for ", " is not used for ", " is used only for "),
    (" is part of ", " is not part of ", " is only part of "),
    (" is made of ", " is not made of ", " is made only of "),
    (" is ", " is not ", " is only "),
    (" are ", " are not ", " are only "),
    (" can ", " cannot ", " can only "),
    (" has ", " does not have ", " only has "),
    (" causes ", " does not cause ", " only causes "),
    (" wants ", " does not want ", " only wants "),
];

/// The earliest relation phrase of a claim, replaced by its negated (`qualified = false`)
/// or qualified form.
fn rephrase(claim: &str, qualified: bool) -> Option<String> {
    let (at, row) = PHRASES
        .iter()
        .filter_map(|row| claim.find(row.0).map(|at| (at, row)))
        .min_by_key(|(at, row)| (*at, std::cmp::Reverse(row.0.len())))?;
    let with = if qualified { row.2 } else { row.1 };
    Some(format!("{}{with}{}", &claim[..at], &claim[at + row.0.len()..]))
}

/// The counterfactual of `claim` by `rule`, or `None` when the rule does not apply.
/// `surface` is the edge's surface text (with its `[[…]]` markers), for relation disruption.
pub fn apply(rule: &str, claim: &str, surface: Option<&str>) -> Option<String> {
    match rule {
        "negation" => rephrase(claim, false),
        "absolute_qualifier" => rephrase(claim, true),
        "antonym" => antonym(claim),
        "relation_disruption" => disrupt(surface?),
        _ => None,
    }
}

fn antonym(claim: &str) -> Option<String> {
    let mut out = Vec::new();
    let mut done = false;
    for word in claim.split(' ') {
        let lower = word.to_lowercase();
        match LEXICON.get(&lower) {
            Some(a) if !done => {
                done = true;
                let capital = word.chars().next().is_some_and(char::is_uppercase);
                out.push(if capital { capitalize(a) } else { a.clone() });
            }
            _ => out.push(word.to_string()),
        }
    }
    done.then(|| out.join(" "))
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

/// The two `[[…]]` concepts of a surface text swapped, rendered as a claim.
fn disrupt(surface: &str) -> Option<String> {
    let spans: Vec<(usize, usize)> = surface
        .match_indices("[[")
        .filter_map(|(s, _)| surface[s..].find("]]").map(|e| (s, s + e + 2)))
        .collect();
    let [(a0, a1), (b0, b1)] = spans.as_slice() else { return None };
    let (a, b) = (&surface[a0 + 2..a1 - 2], &surface[b0 + 2..b1 - 2]);
    if a.eq_ignore_ascii_case(b) || a1 > b0 {
        return None;
    }
    let swapped = format!("{}{b}{}{a}{}", &surface[..*a0], &surface[*a1..*b0], &surface[*b1..]);
    Some(super::conceptnet::render_surface(&swapped, "en"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_on_fixture_claims() {
        let wheat = "You are likely to find wheat in a field";
        let surface = "You are likely to find [[wheat]] in [[a field]]";
        assert_eq!(apply("negation", wheat, None).unwrap(), "You are unlikely to find wheat in a field");
        assert_eq!(apply("absolute_qualifier", wheat, None).unwrap(), "You can only find wheat in a field");
        assert_eq!(apply("relation_disruption", wheat, Some(surface)).unwrap(), "You are likely to find a field in wheat");
        assert_eq!(apply("negation", "assay is a type of test", None).unwrap(), "assay is not a type of test");
        assert_eq!(
            apply("antonym", "Something you find on a test is hard questions", None).unwrap(),
            "Something you lose on a test is hard questions"
        );
        assert_eq!(apply("antonym", "assay is a type of test", None), None, "no lexicon word");
        assert_eq!(apply("relation_disruption", wheat, None), None, "needs the surface text");
        assert_eq!(apply("negation", "wheat grows", None), None);
        assert_eq!(apply("shuffle", wheat, None), None);
        assert_eq!(
            apply("negation", "a balalaika is used for making music", None).unwrap(),
            "a balalaika is not used for making music",
            "the longest phrase at the earliest position"
        );
    }
}
