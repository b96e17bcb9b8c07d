//! How a provider call fails: the kind of failure (which decides retry, a record's
//! failure or the run's stop) and the error a call returns.

use std::time::Duration;

/// How a provider call failed; decides retry, per-record failure or run stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 429, or 503 with overload: retry, slow down.
    RateLimited,
    /// Other 5xx: retry.
    Server,
    /// No answer within the timeout: retry.
    Timeout,
    /// Connection refused/reset: retry.
    Connection,
    /// A 2xx whose body is not a valid completion: retry.
    Malformed,
    /// 400/413/422: the request itself is wrong; never retried; the record fails.
    Rejected,
    /// 401/403: stops the run.
    Auth,
    /// 404 (model or endpoint not found): stops the run.
    NotFound,
    /// The circuit breaker gave up on the provider: stops the run.
    Unavailable,
    /// Batch mode: the request waits for a provider batch (not an error of the record).
    Deferred,
    /// `max_cost_usd` would be passed: stops the run before paying.
    Budget,
}

impl ErrorKind {
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited
                | ErrorKind::Server
                | ErrorKind::Timeout
                | ErrorKind::Connection
                | ErrorKind::Malformed
        )
    }

    /// Errors that make every further request pointless: stop the run with one message.
    pub fn fatal(self) -> bool {
        matches!(self, ErrorKind::Auth | ErrorKind::NotFound | ErrorKind::Unavailable | ErrorKind::Budget)
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Server => "server_error",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connection => "connection",
            ErrorKind::Malformed => "malformed_response",
            ErrorKind::Rejected => "rejected",
            ErrorKind::Auth => "auth",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Deferred => "deferred",
            ErrorKind::Budget => "cost_cap",
        }
    }

    /// Classify an HTTP status.
    pub fn from_status(status: u16) -> ErrorKind {
        match status {
            429 => ErrorKind::RateLimited,
            503 | 529 => ErrorKind::RateLimited,
            401 | 403 => ErrorKind::Auth,
            404 => ErrorKind::NotFound,
            408 => ErrorKind::Timeout,
            s if s >= 500 => ErrorKind::Server,
            _ => ErrorKind::Rejected,
        }
    }
}

#[derive(Debug, Clone)]
pub struct LlmError {
    pub kind: ErrorKind,
    /// Message for humans, secrets removed.
    pub message: String,
    /// Server-requested wait (Retry-After, x-ratelimit-reset-*).
    pub retry_after: Option<Duration>,
}

impl LlmError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> LlmError {
        LlmError { kind, message: message.into(), retry_after: None }
    }
}

impl std::fmt::Display for LlmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.name())
    }
}

impl std::error::Error for LlmError {}
