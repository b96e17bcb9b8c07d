//! A provider's answer ([`ChatResponse`]) and its token usage: below the call types of
//! `lib.rs` and the batch API (`batch.rs`), which both return it.

use serde::{Deserialize, Serialize};

/// Token usage reported by the server (or estimated).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    pub text: String,
    pub finish_reason: String,
    pub usage: Usage,
    /// The model the server says answered.
    pub model: String,
    /// The backend configuration the server says answered (OpenAI's `system_fingerprint`), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
}
