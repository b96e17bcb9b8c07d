//! What every embedder is: the `Embedder` trait (texts into vectors, with an identity for
//! cache keys) and the `Fitter` of one that learns corpus statistics first.

use std::sync::Arc;

use anyhow::Result;
use async_trait::async_trait;

use synth_llm::CallCtx;

/// Turns texts into vectors.
#[async_trait]
pub trait Embedder: Send + Sync {
    /// Identity for cache keys and fingerprints (kind, model, dimension, options,
    /// and fitted statistics).
    fn id(&self) -> String;
    fn dim(&self) -> usize;
    /// Texts per call.
    fn batch_size(&self) -> usize {
        64
    }
    /// A fitter when the embedder learns corpus statistics first.
    fn fitter(&self) -> Option<Box<dyn Fitter>> {
        None
    }
    /// Whether vectors are worth keeping in the response cache: no for an embedder that
    /// computes a vector faster than the cache can store and fetch it (`hashing`).
    fn cacheable(&self) -> bool {
        true
    }
    /// Embed on the calling thread with every core (rayon), for CPU-only embedders;
    /// `None`: use [`Embedder::embed`]. Same vectors, same order.
    fn embed_blocking(&self, _texts: &[String]) -> Option<Vec<Vec<f32>>> {
        None
    }
    async fn embed(&self, texts: &[String], ctx: &CallCtx) -> Result<Vec<Vec<f32>>>;
}

/// Collects corpus statistics, then yields the fitted embedder.
pub trait Fitter: Send {
    fn observe(&mut self, text: &str);
    fn finish(self: Box<Self>) -> Arc<dyn Embedder>;
}
