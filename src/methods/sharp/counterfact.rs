//! Rule-based counterfactual claims (spec §2 `sh_counterfact`; the paper names the rule
//! families only: "adding negatives or absolute qualifiers to factual statements,
//! converting entities to antonyms, and disrupting entity relationships"). The
//! operationalization is [R], and its words are data (`rules/sharp/<lang>/`, read by
//! [`super::rules`]): `negation` and `absolute_qualifier` replace the claim's earliest
//! relation phrase by its negated / qualified form; `antonym` replaces a concept by a
//! ConceptNet `/r/Antonym` neighbour of its node (end node first), or else the claim's earliest
//! lexicon word by its antonym; `relation_disruption` swaps the two concepts of the surface
//! text (`swap`) or puts another relation's tail in place of this one's (`foreign_tail`).
//! Each result says what it did (`detail`). A rule that does not fit a claim gives `None`.
//! Drafts: the paper had each counterfactual checked false by a human (`sharp_verify`).

use std::collections::HashMap;

use super::rules::Rules;
use super::text::{find_phrase, zh_convert};

/// The rules, in their default order.
pub const RULES: &[&str] = &["negation", "absolute_qualifier", "antonym", "relation_disruption"];
/// Where antonyms come from.
pub const ANTONYM_SOURCES: &[&str] = &["conceptnet", "lexicon"];
/// How relation disruption disrupts.
pub const DISRUPTIONS: &[&str] = &["swap", "foreign_tail"];

/// ConceptNet's `/r/Antonym` edges of one language as an undirected graph of terms.
#[derive(Debug, Default)]
pub struct AntonymGraph {
    map: HashMap<String, Vec<String>>,
}

impl AntonymGraph {
    pub fn add(&mut self, a: &str, b: &str) {
        if a == b {
            return;
        }
        self.map.entry(a.to_string()).or_default().push(b.to_string());
        self.map.entry(b.to_string()).or_default().push(a.to_string());
    }

    /// Sorts and de-duplicates the neighbours (so a choice never depends on file order).
    pub fn finish(&mut self) {
        for v in self.map.values_mut() {
            v.sort();
            v.dedup();
        }
    }

    pub fn neighbours(&self, term: &str) -> &[String] {
        self.map.get(term).map(Vec::as_slice).unwrap_or_default()
    }

    /// Terms with at least one antonym.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// A claim and the parts of its edge the rules need (in the claim's script: Chinese ones
/// already converted).
#[derive(Debug, Clone, Default)]
pub struct Claim<'a> {
    pub text: &'a str,
    /// The surface text with its `[[…]]` markers.
    pub surface: Option<&'a str>,
    /// How the start / end concept reads in the claim (`surfaceStart` / `surfaceEnd`, else the term).
    pub start_span: Option<&'a str>,
    pub end_span: Option<&'a str>,
    /// The nodes' ConceptNet terms (`/c/en/hot/a` → `hot`), for antonym look-ups.
    pub term_start: Option<&'a str>,
    pub term_end: Option<&'a str>,
}

/// A counterfactual claim and what was done to get it.
#[derive(Debug, Clone, PartialEq)]
pub struct Counterfactual {
    pub claim: String,
    pub detail: String,
}

/// The rules of one language with their settings.
pub struct Rewriter<'a> {
    pub rules: &'a Rules,
    pub graph: &'a AntonymGraph,
    pub antonym_sources: &'a [String],
    pub disruption: &'a str,
    /// How ConceptNet terms are converted before they go into a Chinese claim.
    pub zh_convert: &'a str,
}

fn replace_at(text: &str, at: usize, len: usize, with: &str) -> String {
    format!("{}{with}{}", &text[..at], &text[at + len..])
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

impl Rewriter<'_> {
    /// The counterfactual of `claim` by `rule`, or `None` when the rule does not apply.
    /// `pick` chooses among several antonyms; `foreign_end` is another relation's tail
    /// (for `foreign_tail` disruption).
    pub fn apply(&self, rule: &str, claim: &Claim<'_>, pick: u64, foreign_end: Option<&str>) -> Option<Counterfactual> {
        match rule {
            "negation" => self.rephrase(claim.text, false),
            "absolute_qualifier" => self.rephrase(claim.text, true),
            "antonym" => self.antonym_sources.iter().find_map(|s| match s.as_str() {
                "conceptnet" => self.kg_antonym(claim, pick),
                "lexicon" => self.lexicon_antonym(claim.text),
                _ => None,
            }),
            "relation_disruption" => match self.disruption {
                "foreign_tail" => {
                    let (span, with) = (claim.end_span?, foreign_end?);
                    let at = find_phrase(claim.text, span)?;
                    (span != with).then(|| Counterfactual {
                        claim: replace_at(claim.text, at, span.len(), with),
                        detail: format!("tail \"{span}\" replaced by \"{with}\""),
                    })
                }
                _ => self.swap(claim.surface?),
            },
            _ => None,
        }
    }

    /// The earliest relation phrase (then the longest) replaced by its negated or qualified form.
    fn rephrase(&self, text: &str, qualified: bool) -> Option<Counterfactual> {
        let (at, p) = self
            .rules
            .phrases
            .iter()
            .filter(|p| !qualified || p.qualified.is_some())
            .filter_map(|p| find_phrase(text, &p.phrase).map(|at| (at, p)))
            .min_by_key(|(at, p)| (*at, std::cmp::Reverse(p.phrase.len())))?;
        let with = if qualified { p.qualified.as_deref()? } else { &p.negated };
        Some(Counterfactual {
            claim: replace_at(text, at, p.phrase.len(), with),
            detail: format!("\"{}\" → \"{with}\"", p.phrase),
        })
    }

    fn kg_antonym(&self, claim: &Claim<'_>, pick: u64) -> Option<Counterfactual> {
        [(claim.term_end, claim.end_span, "end"), (claim.term_start, claim.start_span, "start")].into_iter().find_map(
            |(term, span, which)| {
                let (term, span) = (term?, span?);
                let options = self.graph.neighbours(term);
                if options.is_empty() {
                    return None;
                }
                let antonym = &options[(pick % options.len() as u64) as usize];
                let mut with = antonym.replace('_', " ");
                if self.rules.lang == "zh" {
                    with = zh_convert(&with, self.zh_convert);
                }
                let at = find_phrase(claim.text, span)?;
                (with != span).then(|| Counterfactual {
                    claim: replace_at(claim.text, at, span.len(), &with),
                    detail: format!("conceptnet /r/Antonym of the {which} node: \"{span}\" → \"{with}\""),
                })
            },
        )
    }

    /// The earliest lexicon word of the claim (then the longest), swapped for its antonym.
    /// English words match whole and case-insensitively (a capital first letter is kept).
    fn lexicon_antonym(&self, text: &str) -> Option<Counterfactual> {
        let lower = text.to_ascii_lowercase();
        let (at, word) = self
            .rules
            .antonym_words
            .iter()
            .filter_map(|w| find_phrase(&lower, w).map(|at| (at, w)))
            .min_by_key(|(at, w)| (*at, std::cmp::Reverse(w.len())))?;
        let original = &text[at..at + word.len()];
        let antonym = &self.rules.antonyms[word];
        let with =
            if original.chars().next().is_some_and(char::is_uppercase) { capitalize(antonym) } else { antonym.clone() };
        Some(Counterfactual {
            claim: replace_at(text, at, word.len(), &with),
            detail: format!("lexicon: \"{original}\" → \"{with}\""),
        })
    }

    /// The two `[[…]]` concepts of a surface text swapped, rendered as a claim.
    fn swap(&self, surface: &str) -> Option<Counterfactual> {
        let spans: Vec<(usize, usize)> =
            surface.match_indices("[[").filter_map(|(s, _)| surface[s..].find("]]").map(|e| (s, s + e + 2))).collect();
        let [(a0, a1), (b0, b1)] = spans.as_slice() else { return None };
        let (a, b) = (&surface[a0 + 2..a1 - 2], &surface[b0 + 2..b1 - 2]);
        if a.eq_ignore_ascii_case(b) || a1 > b0 {
            return None;
        }
        let swapped = format!("{}{b}{}{a}{}", &surface[..*a0], &surface[*a1..*b0], &surface[*b1..]);
        Some(Counterfactual {
            claim: super::conceptnet::render_surface(&swapped, &self.rules.lang),
            detail: format!("swapped \"{a}\" and \"{b}\""),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(lang: &str) -> Rules {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../..")).join("rules/sharp");
        Rules::load(&dir, "rules/sharp", lang).unwrap()
    }

    fn claim<'a>(text: &'a str, surface: Option<&'a str>) -> Claim<'a> {
        Claim { text, surface, ..Default::default() }
    }

    #[test]
    fn each_rule_on_fixture_claims() {
        let (en, graph) = (rules("en"), AntonymGraph::default());
        let sources = vec!["conceptnet".to_string(), "lexicon".to_string()];
        let w =
            Rewriter { rules: &en, graph: &graph, antonym_sources: &sources, disruption: "swap", zh_convert: "t2s" };
        let apply = |rule: &str, c: &Claim<'_>| w.apply(rule, c, 0, None).map(|c| c.claim);
        let wheat = "You are likely to find wheat in a field";
        let surface = "You are likely to find [[wheat]] in [[a field]]";
        assert_eq!(apply("negation", &claim(wheat, None)).unwrap(), "You are unlikely to find wheat in a field");
        assert_eq!(apply("absolute_qualifier", &claim(wheat, None)).unwrap(), "You can only find wheat in a field");
        assert_eq!(
            apply("relation_disruption", &claim(wheat, Some(surface))).unwrap(),
            "You are likely to find a field in wheat"
        );
        assert_eq!(apply("negation", &claim("assay is a type of test", None)).unwrap(), "assay is not a type of test");
        assert_eq!(
            apply("antonym", &claim("Something you find on a test is hard questions", None)).unwrap(),
            "Something you lose on a test is hard questions"
        );
        assert_eq!(apply("antonym", &claim("Hard work is good", None)).unwrap(), "Easy work is good", "case kept");
        assert_eq!(apply("antonym", &claim("assay is a type of test", None)), None, "no lexicon word");
        assert_eq!(apply("relation_disruption", &claim(wheat, None)), None, "needs the surface text");
        assert_eq!(apply("negation", &claim("wheat grows", None)), None);
        assert_eq!(apply("shuffle", &claim(wheat, None)), None);
        assert_eq!(
            apply("negation", &claim("a balalaika is used for making music", None)).unwrap(),
            "a balalaika is not used for making music",
            "the longest phrase at the earliest position"
        );
        assert_eq!(
            apply("negation", &claim("This island is big", None)).unwrap(),
            "This island is not big",
            "whole words"
        );
    }

    #[test]
    fn conceptnet_antonyms_come_first_and_foreign_tails_disrupt() {
        let en = rules("en");
        let mut graph = AntonymGraph::default();
        graph.add("test", "breeze");
        graph.add("test", "recess");
        graph.add("recess", "test");
        graph.finish();
        assert_eq!(graph.neighbours("test"), ["breeze", "recess"]);
        let sources = vec!["conceptnet".to_string(), "lexicon".to_string()];
        let w = Rewriter {
            rules: &en,
            graph: &graph,
            antonym_sources: &sources,
            disruption: "foreign_tail",
            zh_convert: "t2s",
        };
        let c = Claim {
            text: "assay is a type of test",
            end_span: Some("test"),
            start_span: Some("assay"),
            term_start: Some("assay"),
            term_end: Some("test"),
            ..Default::default()
        };
        let cf = w.apply("antonym", &c, 1, None).unwrap();
        assert_eq!(cf.claim, "assay is a type of recess");
        assert!(cf.detail.starts_with("conceptnet /r/Antonym of the end node"), "{}", cf.detail);
        let lexicon_only = vec!["lexicon".to_string()];
        let w2 = Rewriter { antonym_sources: &lexicon_only, ..w };
        assert_eq!(w2.apply("antonym", &c, 1, None), None);
        let cf = w.apply("relation_disruption", &c, 0, Some("a musical instrument")).unwrap();
        assert_eq!(cf.claim, "assay is a type of a musical instrument");
    }

    #[test]
    fn chinese_rules() {
        let zh = rules("zh");
        let graph = AntonymGraph::default();
        let sources = vec!["conceptnet".to_string(), "lexicon".to_string()];
        let w =
            Rewriter { rules: &zh, graph: &graph, antonym_sources: &sources, disruption: "swap", zh_convert: "t2s" };
        let apply = |rule: &str, c: &Claim<'_>| w.apply(rule, c, 0, None).map(|c| c.claim);
        let text = "经理来访可能代表检查。";
        assert_eq!(apply("negation", &claim(text, None)).unwrap(), "经理来访不可能代表检查。");
        assert_eq!(apply("absolute_qualifier", &claim(text, None)).unwrap(), "经理来访一定代表检查。");
        assert_eq!(
            apply("relation_disruption", &claim(text, Some("*[[经理来访]] 可能代表 [[检查]] 。"))).unwrap(),
            "检查可能代表经理来访。"
        );
        assert_eq!(apply("antonym", &claim("夏天很热", None)).unwrap(), "冬天很热", "earliest, longest word");
    }
}
