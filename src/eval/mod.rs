//! Evaluation of generated answers against references, as the RoleMRC authors'
//! evaluation code computes it: BLEU (HF `evaluate` "bleu"), ROUGE (Google's
//! `rouge_score`), METEOR (NLTK with WordNet 3.0). Each metric is one module with a
//! pure function per (response, reference) pair.

pub mod bleu;
pub mod meteor;
pub mod porter;
pub mod rouge;
pub mod score;
pub mod wordnet;
