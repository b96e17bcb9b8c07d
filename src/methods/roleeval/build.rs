//! Building a RoleEval-style benchmark (paper §3, spec §2.2), the pure parts: the
//! question slots of a character (17 basic-knowledge + 3 multi-hop reasoning by
//! default, knowledge types and formats spread over them), the automatic quality
//! check per character (0.3 ≤ x ≤ 0.9, y ≤ 0.8, x − y ≥ 0.15, compared with a
//! tolerance because accuracies over 20 questions are not exact in binary), and
//! the checks a drafted question must pass.

use serde::Deserialize;

/// The paper's knowledge types, reasoning types and question formats.
pub const KNOWLEDGE_TYPES: [&str; 3] = ["attribute", "relationship", "experience"];
pub const REASONING_TYPES: [&str; 3] = ["relationship", "event_participant", "timeline"];

/// One question to draft for a character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub index: usize,
    /// `knowledge` or `reasoning`.
    pub kind: &'static str,
    /// A knowledge type or a reasoning type.
    pub qtype: &'static str,
    /// `direct`, `negation` or `non_occurrence` (reasoning questions are direct).
    pub format: &'static str,
}

/// How many questions of each sort a character gets (reconstructed split of the formats:
/// the paper names the formats, not their counts).
#[derive(Debug, Clone, Deserialize)]
pub struct SlotCounts {
    pub knowledge: usize,
    pub reasoning: usize,
    pub negation: usize,
    pub non_occurrence: usize,
}

/// The slots of one character: knowledge first (types in turn; the last `negation` +
/// `non_occurrence` of them in those formats), then reasoning (types in turn).
pub fn slots(c: &SlotCounts) -> Result<Vec<Slot>, String> {
    if c.negation + c.non_occurrence > c.knowledge {
        return Err(format!(
            "{} negation + {} non-occurrence questions do not fit in {} knowledge questions",
            c.negation, c.non_occurrence, c.knowledge
        ));
    }
    let mut out = Vec::new();
    let direct = c.knowledge - c.negation - c.non_occurrence;
    for i in 0..c.knowledge {
        let format = if i < direct {
            "direct"
        } else if i < direct + c.negation {
            "negation"
        } else {
            "non_occurrence"
        };
        out.push(Slot { index: i, kind: "knowledge", qtype: KNOWLEDGE_TYPES[i % 3], format });
    }
    for j in 0..c.reasoning {
        out.push(Slot { index: c.knowledge + j, kind: "reasoning", qtype: REASONING_TYPES[j % 3], format: "direct" });
    }
    Ok(out)
}

/// The quality check's bounds (paper §3.2: x_l, x_u, y_u, d) and the comparison tolerance.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct QcBounds {
    pub strong_min: f64,
    pub strong_max: f64,
    pub weak_max: f64,
    pub min_gap: f64,
    pub tolerance: f64,
}

/// Why a character fails the check (empty: it passes). `x`: the strong model's accuracy,
/// `y`: the weak model's, both in 0..1.
pub fn qc_reasons(x: f64, y: f64, b: &QcBounds) -> Vec<String> {
    let t = b.tolerance;
    let mut out = Vec::new();
    if x < b.strong_min - t {
        out.push(format!("strong accuracy {x:.2} < {}", b.strong_min));
    }
    if x > b.strong_max + t {
        out.push(format!("strong accuracy {x:.2} > {}", b.strong_max));
    }
    if y > b.weak_max + t {
        out.push(format!("weak accuracy {y:.2} > {}", b.weak_max));
    }
    if x - y < b.min_gap - t {
        out.push(format!("gap {:.2} < {}", x - y, b.min_gap));
    }
    out
}

/// What is wrong with a drafted question (`None`: usable): an empty stem or option, an
/// answer that is not one of the letters, two equal options.
pub fn check_question(question: &str, options: &[String], answer: &str, letters: &[&str]) -> Option<String> {
    if question.trim().is_empty() {
        return Some("the question is empty".into());
    }
    if let Some(k) = options.iter().position(|o| o.trim().is_empty()) {
        return Some(format!("option {} is empty", letters[k]));
    }
    if !letters.contains(&answer) {
        return Some(format!("answer \"{answer}\" is not one of {}", letters.join("/")));
    }
    let mut seen = std::collections::BTreeSet::new();
    if !options.iter().all(|o| seen.insert(o.trim())) {
        return Some("two options are the same".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAPER: QcBounds =
        QcBounds { strong_min: 0.3, strong_max: 0.9, weak_max: 0.8, min_gap: 0.15, tolerance: 1e-9 };

    #[test]
    fn seventeen_plus_three_slots() {
        let s = slots(&SlotCounts { knowledge: 17, reasoning: 3, negation: 2, non_occurrence: 1 }).unwrap();
        assert_eq!(s.len(), 20);
        assert_eq!(s.iter().filter(|x| x.kind == "reasoning").count(), 3);
        let r: Vec<&str> = s[17..].iter().map(|x| x.qtype).collect();
        assert_eq!(r, REASONING_TYPES);
        let formats: Vec<&str> = s[..17].iter().map(|x| x.format).collect();
        assert_eq!(formats.iter().filter(|f| **f == "negation").count(), 2);
        assert_eq!(formats[16], "non_occurrence");
        assert!(slots(&SlotCounts { knowledge: 2, reasoning: 0, negation: 2, non_occurrence: 1 }).is_err());
    }

    #[test]
    fn quality_check_with_tolerance() {
        // 20 questions: accuracies are multiples of 0.05, and 7/20 - 4/20 is 0.14999999999999997.
        let acc = |k: u32| k as f64 / 20.0;
        assert!((acc(7) - acc(4)) < 0.15, "the binary pitfall the tolerance is for");
        assert!(qc_reasons(acc(7), acc(4), &PAPER).is_empty());
        assert!(qc_reasons(acc(13), acc(10), &PAPER).is_empty());
        assert_eq!(qc_reasons(acc(7), acc(5), &PAPER), vec!["gap 0.10 < 0.15"]);
        assert_eq!(qc_reasons(acc(19), acc(17), &PAPER).len(), 3, "too easy for both, gap too small");
        assert_eq!(qc_reasons(acc(5), acc(0), &PAPER), vec!["strong accuracy 0.25 < 0.3"]);
        assert!(qc_reasons(acc(6), acc(3), &PAPER).is_empty(), "0.3 and a gap of 0.15 are inside");
        assert!(qc_reasons(acc(18), acc(15), &PAPER).is_empty(), "0.9 and 0.75");
        assert_eq!(
            qc_reasons(acc(20), acc(17), &PAPER),
            vec!["strong accuracy 1.00 > 0.9", "weak accuracy 0.85 > 0.8"]
        );
    }

    #[test]
    fn drafted_questions_are_checked() {
        let o = |v: [&str; 4]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let l = ["A", "B", "C", "D"];
        assert_eq!(check_question("q", &o(["a", "b", "c", "d"]), "B", &l), None);
        assert_eq!(check_question("q", &o(["a", "", "c", "d"]), "B", &l).unwrap(), "option B is empty");
        assert_eq!(
            check_question("q", &o(["a", "b", "c", "d"]), "E", &l).unwrap(),
            "answer \"E\" is not one of A/B/C/D"
        );
        assert_eq!(check_question("q", &o(["a", "b", " a", "d"]), "A", &l).unwrap(), "two options are the same");
        assert_eq!(check_question(" ", &o(["a", "b", "c", "d"]), "A", &l).unwrap(), "the question is empty");
    }
}
