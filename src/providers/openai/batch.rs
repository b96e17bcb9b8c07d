//! OpenAI's Batch API (also served by several OpenAI-compatible providers) through
//! async-openai's Files and Batches APIs: a part's file of lines is uploaded (purpose
//! `batch`, streamed from disk, named `synth-<part>.jsonl` so an upload whose answer
//! was lost can be found by name), a batch is created with metadata naming the part,
//! the stage and the output directory (so a create whose answer was lost is found by
//! listing), polled, and its output and error files are downloaded. Answers are read
//! by our own lenient types (`byot`): compatible servers differ in optional fields.

use std::collections::HashSet;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::traits::RequestOptionsBuilder;
use async_openai::types::InputSource;
use async_openai::types::files::{CreateFileRequest, FileInput, FilePurpose};
use serde::Deserialize;

use synth_llm::batch::{
    BatchApi, BatchBody, BatchInfo, BatchState, Endpoint as LineEndpoint, LineOutcome, PartRef, Results,
    parse_openai_line,
};
use synth_llm::openai::{Endpoint, observed};
use synth_llm::{ChatResponse, ErrorKind, LlmError};

/// Tries of a control call (upload, retrieve, list, download) on transient failures.
const TRIES: u32 = 8;

/// OpenAI's Batch API limits on one input file: requests, bytes. `vllm run-batch` files
/// keep them too, so a part is the same size on either.
pub const LIMITS: (u64, u64) = (50_000, 200_000_000);

pub struct OpenAiBatches {
    client: Client<OpenAIConfig>,
    completion_window: String,
}

impl OpenAiBatches {
    /// One page (100, newest first) of the account's batches after `after`.
    async fn list_page(&self, after: Option<&str>) -> Result<BatchList, LlmError> {
        let mut query = vec![("limit", "100".to_string())];
        if let Some(a) = after {
            query.push(("after", a.to_string()));
        }
        synth_llm::batch::with_retries(TRIES, || {
            let query = query.clone();
            async move {
                let batches = self.client.batches();
                let batches = batches.query(&query).map_err(|e| LlmError::new(ErrorKind::Rejected, e.to_string()))?;
                observed(batches.list_byot()).await
            }
        })
        .await
    }

    pub fn new(endpoint: Endpoint, completion_window: &str) -> Result<OpenAiBatches, String> {
        Ok(OpenAiBatches {
            client: synth_llm::openai::client(&endpoint)?,
            completion_window: completion_window.to_string(),
        })
    }
}

#[derive(Deserialize)]
struct FileObject {
    id: String,
    #[serde(default)]
    filename: Option<String>,
    #[serde(default)]
    bytes: Option<u64>,
}

#[derive(Deserialize)]
struct FileList {
    #[serde(default)]
    data: Vec<FileObject>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    last_id: Option<String>,
}

#[derive(Deserialize)]
struct Counts {
    #[serde(default)]
    total: u64,
    #[serde(default)]
    completed: u64,
    #[serde(default)]
    failed: u64,
}

#[derive(Deserialize)]
struct BatchError {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct BatchErrors {
    #[serde(default)]
    data: Vec<BatchError>,
}

#[derive(Deserialize)]
struct BatchObject {
    id: String,
    status: String,
    #[serde(default)]
    output_file_id: Option<String>,
    #[serde(default)]
    error_file_id: Option<String>,
    #[serde(default)]
    errors: Option<BatchErrors>,
    #[serde(default)]
    created_at: u64,
    #[serde(default)]
    request_counts: Option<Counts>,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct BatchList {
    #[serde(default)]
    data: Vec<BatchObject>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    last_id: Option<String>,
}

impl BatchObject {
    fn info(self) -> Result<BatchInfo, LlmError> {
        let state = BatchState::parse(&self.status).ok_or_else(|| {
            LlmError::new(ErrorKind::Malformed, format!("batch {}: unknown status \"{}\"", self.id, self.status))
        })?;
        let counts = self.request_counts.unwrap_or(Counts { total: 0, completed: 0, failed: 0 });
        let failure = self
            .errors
            .and_then(|e| e.data.into_iter().next())
            .map(|e| (e.code.unwrap_or_default(), synth_core::secrets::scrub(&e.message.unwrap_or_default())));
        Ok(BatchInfo {
            id: self.id,
            state,
            total: counts.total,
            completed: counts.completed,
            failed: counts.failed,
            output: self.output_file_id,
            errors: self.error_file_id,
            failure,
            created_at: self.created_at,
            part: self.metadata.as_ref().and_then(|m| m["synth_part"].as_str().map(str::to_string)),
        })
    }
}

/// Parts up to this many bytes are uploaded from memory, larger ones streamed from disk.
const UPLOAD_FROM_MEMORY: u64 = 64 << 20;

#[async_trait::async_trait]
impl BatchApi for OpenAiBatches {
    fn kind(&self) -> &'static str {
        "openai"
    }

    fn answer(
        &self,
        endpoint: LineEndpoint,
        body: &serde_json::value::RawValue,
        doc: &str,
        model: &str,
    ) -> Result<ChatResponse, LlmError> {
        synth_llm::openai::answer_line(endpoint, body, doc, model)
    }

    fn limits(&self) -> (u64, u64) {
        LIMITS
    }

    fn line(&self, key: &str, body: &BatchBody) -> String {
        synth_llm::batch::openai_line(key, body)
    }

    async fn upload(&self, part: &PartRef) -> Result<Option<String>, LlmError> {
        // Sent under the part's file name (`synth-<part>.jsonl`, as on disk), which
        // `find_file` looks for. A part up to UPLOAD_FROM_MEMORY is read whole first: from
        // a path, async-openai reads the file through tokio's blocking pool 8 KiB at a
        // time, which doubled the upload's wall for a 20 MB part (BENCHMARKS.md, "Batch
        // mode"); a retry resends the same bytes without reading them again.
        let source = if part.bytes <= UPLOAD_FROM_MEMORY {
            let path = part.input.clone();
            let bytes = tokio::task::spawn_blocking(move || std::fs::read(path))
                .await
                .map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("reading the batch part: {e}")))?
                .map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("reading {}: {e}", part.input.display())))?;
            InputSource::Bytes { filename: part.filename(), bytes: bytes.into() }
        } else {
            InputSource::Path { path: part.input.clone() }
        };
        let request =
            CreateFileRequest { file: FileInput { source }, purpose: FilePurpose::Batch, expires_after: None };
        let file: FileObject = synth_llm::batch::with_retries(TRIES, || {
            let request = request.clone();
            async move { observed(self.client.files().create_byot(request)).await }
        })
        .await?;
        Ok(Some(file.id))
    }

    async fn find_file(&self, part: &PartRef) -> Result<Option<String>, LlmError> {
        let name = part.filename();
        let mut after: Option<String> = None;
        loop {
            let mut query = vec![("purpose", "batch".to_string()), ("limit", "10000".to_string())];
            if let Some(a) = &after {
                query.push(("after", a.clone()));
            }
            let list: FileList = synth_llm::batch::with_retries(TRIES, || {
                let query = query.clone();
                async move {
                    let files = self.client.files();
                    let files = files.query(&query).map_err(|e| LlmError::new(ErrorKind::Rejected, e.to_string()))?;
                    observed(files.list_byot()).await
                }
            })
            .await?;
            if let Some(f) = list
                .data
                .iter()
                .find(|f| f.filename.as_deref() == Some(name.as_str()) && f.bytes.is_none_or(|b| b == part.bytes))
            {
                return Ok(Some(f.id.clone()));
            }
            match (list.has_more, list.last_id.or_else(|| list.data.last().map(|f| f.id.clone()))) {
                (true, Some(last)) => after = Some(last),
                _ => return Ok(None),
            }
        }
    }

    async fn create(&self, part: &PartRef, file: Option<&str>) -> Result<BatchInfo, LlmError> {
        let file = file.ok_or_else(|| LlmError::new(ErrorKind::Rejected, "an OpenAI batch needs an uploaded file"))?;
        let body = serde_json::json!({
            "input_file_id": file,
            "endpoint": part.endpoint.path(),
            "completion_window": self.completion_window,
            "metadata": {"synth_part": part.part, "synth_stage": part.stage, "synth_dir": part.dir_tag},
        });
        let batch: BatchObject = observed(self.client.batches().create_byot(body)).await?;
        batch.info()
    }

    async fn find_batch(
        &self,
        part: &PartRef,
        since: u64,
        known: &HashSet<String>,
    ) -> Result<Option<BatchInfo>, LlmError> {
        // Newest first; stop at batches older than the create that may have happened.
        let mut after: Option<String> = None;
        loop {
            let list = self.list_page(after.as_deref()).await?;
            let mut older = false;
            let last = list.last_id.clone().or_else(|| list.data.last().map(|b| b.id.clone()));
            for b in list.data {
                if b.created_at != 0 && b.created_at + 300 < since {
                    older = true;
                    continue;
                }
                let mine = b.metadata.as_ref().is_some_and(|m| {
                    m["synth_part"].as_str() == Some(part.part.as_str())
                        && m["synth_dir"].as_str() == Some(&part.dir_tag)
                });
                if mine && !known.contains(&b.id) {
                    return b.info().map(Some);
                }
            }
            match (list.has_more && !older, last) {
                (true, Some(last)) => after = Some(last),
                _ => return Ok(None),
            }
        }
    }

    async fn list_tagged(&self, dir_tag: &str) -> Result<Vec<BatchInfo>, LlmError> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let list = self.list_page(after.as_deref()).await?;
            let last = list.last_id.clone().or_else(|| list.data.last().map(|b| b.id.clone()));
            for b in list.data {
                if b.metadata.as_ref().is_some_and(|m| m["synth_dir"].as_str() == Some(dir_tag)) {
                    out.push(b.info()?);
                }
            }
            match (list.has_more, last) {
                (true, Some(last)) => after = Some(last),
                _ => return Ok(out),
            }
        }
    }

    async fn retrieve(&self, id: &str) -> Result<BatchInfo, LlmError> {
        let b: BatchObject = synth_llm::batch::with_retries(TRIES, || async move {
            let batches = self.client.batches();
            observed(batches.retrieve_byot(id)).await
        })
        .await?;
        b.info()
    }

    async fn cancel(&self, id: &str) -> Result<BatchInfo, LlmError> {
        let b: BatchObject = synth_llm::batch::with_retries(TRIES, || async move {
            let batches = self.client.batches();
            observed(batches.cancel_byot(id)).await
        })
        .await?;
        b.info()
    }

    async fn download(&self, info: &BatchInfo) -> Result<Results, LlmError> {
        let mut results = Results::default();
        for (file, got) in [(&info.output, &mut results.output), (&info.errors, &mut results.errors)] {
            let Some(file) = file else { continue };
            let bytes = synth_llm::batch::with_retries(TRIES, || async move {
                let files = self.client.files();
                observed(files.content(file)).await
            })
            .await?;
            *got = Some(bytes);
        }
        Ok(results)
    }

    async fn delete_file(&self, id: &str) -> Result<(), LlmError> {
        let _: serde_json::Value = synth_llm::batch::with_retries(TRIES, || async move {
            let files = self.client.files();
            observed(files.delete_byot(id)).await
        })
        .await?;
        Ok(())
    }

    fn parse_line(&self, line: &str) -> Result<(String, LineOutcome), String> {
        parse_openai_line(line)
    }
}
