//! Evaluation of generated answers against references, as the RoleMRC authors'
//! evaluation code computes it: BLEU (HF `evaluate` "bleu"), ROUGE (Google's
//! `rouge_score`), METEOR (NLTK with WordNet 3.0), BERTScore (`bert_score` with an ONNX
//! encoder). Each metric is one module; all but BERTScore are a pure function per
//! (response, reference) pair, BERTScore scores a list of pairs with one loaded model.

pub mod bertscore;
pub mod bleu;
pub mod meteor;
pub mod porter;
pub mod rouge;
pub mod score;
pub mod wordnet;
