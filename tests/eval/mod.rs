//! Reference metrics against the Python implementations (stored fixtures, live re-runs
//! when `SYNTH_EVAL_PYTHON` names an interpreter with them) and `synth score`.

mod bertscore;
mod bleu_rouge;
mod meteor;
mod score;
