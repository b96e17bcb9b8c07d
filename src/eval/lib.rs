//! Reference metric ports, equal to the Python implementations evaluation scripts
//! call (checked against them by the parity tests): BLEU (HF `evaluate` "bleu"), ROUGE (Google's
//! `rouge_score`), METEOR (NLTK with WordNet 3.0), BERTScore (`bert_score` with an ONNX
//! encoder). Each metric is one module; all but BERTScore are a pure function per
//! (response, reference) pair, BERTScore scores a list of pairs with one loaded model.

pub mod bertscore;
pub mod bleu;
pub mod correlation;
pub mod meteor;
pub mod porter;
pub mod rouge;
pub mod score;
pub mod wordnet;

/// A constant regex compiled once per thread. The `regex` crate keeps one pool of search
/// state per `Regex`; rayon threads sharing one contend on it (11% of the string metrics'
/// CPU on 2 cores was spent in that pool), so each thread gets its own copy.
pub struct LocalRegex {
    pattern: &'static str,
    per_thread: thread_local::ThreadLocal<regex::Regex>,
}

impl LocalRegex {
    pub const fn new(pattern: &'static str) -> LocalRegex {
        LocalRegex { pattern, per_thread: thread_local::ThreadLocal::new() }
    }
}

impl std::ops::Deref for LocalRegex {
    type Target = regex::Regex;

    fn deref(&self) -> &regex::Regex {
        self.per_thread.get_or(|| regex::Regex::new(self.pattern).expect("constant regex"))
    }
}
