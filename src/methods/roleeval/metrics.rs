//! RoleEval's numbers (spec §3.5): accuracy per cell as `(correct / total) × 100`
//! computed in that order (it reproduces the paper's printed digits: 255/800 →
//! 31.87, not 31.88), the average as the mean of the category accuracies, and the
//! counts every cell keeps (n, correct, unanswered).

use std::collections::BTreeMap;

/// Counts of one cell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Questions with a known answer.
    pub n: u64,
    pub correct: u64,
    /// Of those, questions the model gave no usable letter for (counted wrong).
    pub unanswered: u64,
}

impl Tally {
    pub fn add(&mut self, correct: bool, answered: bool) {
        self.n += 1;
        self.correct += u64::from(correct);
        self.unanswered += u64::from(!answered);
    }

    /// Accuracy in percent, `None` for an empty cell.
    pub fn pct(&self) -> Option<f64> {
        (self.n > 0).then(|| accuracy_pct(self.correct, self.n))
    }
}

/// `(correct / total) as f64 × 100`, in that order (spec §3.5).
pub fn accuracy_pct(correct: u64, total: u64) -> f64 {
    (correct as f64 / total as f64) * 100.0
}

/// The mean of the defined category accuracies (the paper's Avg), with the summed counts.
pub fn average<'a>(cells: impl IntoIterator<Item = &'a Tally>) -> Option<(f64, Tally)> {
    let mut sum = 0.0;
    let mut k = 0usize;
    let mut total = Tally::default();
    for t in cells {
        if let Some(p) = t.pct() {
            sum += p;
            k += 1;
            total.n += t.n;
            total.correct += t.correct;
            total.unanswered += t.unanswered;
        }
    }
    (k > 0).then(|| (sum / k as f64, total))
}

/// Cells by key, in key order.
pub type Cells<K> = BTreeMap<K, Tally>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_digits_match_the_paper() {
        let two = |c, n| format!("{:.2}", accuracy_pct(c, n));
        assert_eq!(two(255, 800), "31.87");
        assert_eq!(two(473, 800), "59.13");
        assert_eq!(two(435, 800), "54.37");
        assert_eq!(two(199, 800), "24.88");
        // The other order prints other digits (the pitfall the spec warns about).
        assert_eq!(format!("{:.2}", 255.0 * 100.0 / 800.0), "31.88");
        // GPT-4-1106 zh Global 5-shot: the mean of five categories.
        let cells: Vec<Tally> =
            [598, 589, 595, 580, 573].iter().map(|&c| Tally { n: 800, correct: c, unanswered: 0 }).collect();
        let (avg, total) = average(&cells).unwrap();
        assert_eq!(format!("{avg:.2}"), "73.38");
        assert_eq!((total.n, total.correct), (4000, 2935));
        assert_eq!(average(&[Tally::default()]), None);
    }
}
