//! When a RoleMRC preference pair is degenerate: its chosen text (a stylized or
//! rewritten answer) equals its rejected text (the answer it was asked to edit) after
//! whitespace normalization, or — when a threshold is set — is at least that similar
//! by word-level edit distance. Such a pair teaches a preference model nothing and hides
//! a generation failure; the `stylized` parser re-asks it and `rolemrc_assemble` never
//! exports it (failure kind `degenerate_pair`).

/// Whitespace-normalized text: trimmed, every run of whitespace one space.
pub fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Word-level similarity in [0, 1]: 1 − (word edit distance) / (longer text's word
/// count), words split on whitespace (so whitespace never matters); 1 for two empty texts.
pub fn similarity(a: &str, b: &str) -> f64 {
    let (wa, wb): (Vec<&str>, Vec<&str>) = (a.split_whitespace().collect(), b.split_whitespace().collect());
    let longest = wa.len().max(wb.len());
    if longest == 0 {
        return 1.0;
    }
    1.0 - strsim::generic_levenshtein(&wa, &wb) as f64 / longest as f64
}

/// Why `chosen` and `rejected` make a degenerate pair, if they do: equal after whitespace
/// normalization, or (with `max_similarity`) at least that similar.
pub fn degenerate(chosen: &str, rejected: &str, max_similarity: Option<f64>) -> Option<String> {
    if normalize(chosen) == normalize(rejected) {
        return Some("it is the same text as the answer it was asked to edit".into());
    }
    let threshold = max_similarity?;
    // The edit distance is at least the length difference: skip the quadratic part when
    // that alone puts the pair below the threshold.
    let (la, lb) = (chosen.split_whitespace().count(), rejected.split_whitespace().count());
    let longest = la.max(lb).max(1);
    if 1.0 - (la.abs_diff(lb) as f64 / longest as f64) < threshold {
        return None;
    }
    let s = similarity(chosen, rejected);
    (s >= threshold).then(|| {
        format!("it is nearly the same text as the answer it was asked to edit (word similarity {s:.3} ≥ {threshold})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_after_whitespace_normalization_is_degenerate() {
        assert_eq!(normalize("  a\tb \n\n c "), "a b c");
        assert!(degenerate("The answer is 42.", " The  answer\nis 42. ", None).is_some());
        assert!(degenerate("The answer is 42.", "the answer is 42.", None).is_none(), "case is content");
        assert!(degenerate("(She smiles) The answer is 42.", "The answer is 42.", None).is_none());
    }

    #[test]
    fn the_similarity_threshold_is_optional() {
        let a = "Well, the passage says the bridge opened in 1932 and cost a fortune.";
        let b = "The passage says the bridge opened in 1932 and cost a fortune.";
        let s = similarity(a, b);
        assert!((s - (1.0 - 2.0 / 13.0)).abs() < 1e-12, "{s}");
        assert!(degenerate(a, b, None).is_none());
        assert!(degenerate(a, b, Some(0.8)).unwrap().contains("similarity 0.846"));
        assert!(degenerate(a, b, Some(0.9)).is_none());
        // The length shortcut agrees with the full computation.
        assert!(degenerate("a b c d e f g h i j", "a", Some(0.5)).is_none());
        assert_eq!(similarity("", ""), 1.0);
        assert_eq!(similarity("x", ""), 0.0);
    }
}
