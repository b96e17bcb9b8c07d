//! The provider kinds built into synth beside `offline` (which `synth-llm` holds): `openai`
//! (any OpenAI-compatible server, its Batch API or `vllm run-batch`), `anthropic` (the
//! Messages API and Message Batches) and `local` (a GGUF model in-process through
//! llama.cpp). Each is a module with its descriptor ([`synth_llm::provider::ProviderDesc`]);
//! only the top crate depends on this one, and hands [`PROVIDERS`] to the registry, so a
//! change here rebuilds this crate and the top one only.

pub mod anthropic;
pub mod local;
pub mod openai;

use synth_llm::provider::ProviderDesc;

/// The kinds of this crate, in `synth list` order (the registry puts `offline` last).
pub static PROVIDERS: &[&ProviderDesc] = &[&openai::PROVIDER, &anthropic::PROVIDER, &local::PROVIDER];
