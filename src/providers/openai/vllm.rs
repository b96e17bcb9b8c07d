//! A local batch API for models served by vLLM: a part's file is already in the
//! OpenAI batch format that `vllm run-batch -i IN -o OUT --model M` reads and writes,
//! so "creating" a batch runs that command (`batch_command`, with `{input}`,
//! `{output}` and `{model}` replaced) as a child process, and its output file is the
//! batch's results. With no command, synth writes the file, says which command to run
//! and stops (as `--detach`); the next run picks up `synth-<part>.results.jsonl` when
//! it exists. A command a killed synth left running is not adopted: local compute is
//! not billed, so the next run starts it again (its results land in a fresh file).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use synth_llm::batch::{
    BatchApi, BatchBody, BatchInfo, BatchState, Endpoint as LineEndpoint, LineOutcome, PartRef, Results, now,
    parse_openai_line,
};
use synth_llm::{ChatResponse, ErrorKind, LlmError};

/// The command run for a part when none is configured (shown to the user).
pub const DEFAULT_COMMAND: &[&str] = &["vllm", "run-batch", "-i", "{input}", "-o", "{output}", "--model", "{model}"];

enum Run {
    Running(tokio::process::Child, PathBuf),
    Failed(String),
}

pub struct LocalBatch {
    /// Empty: the user runs batches.
    command: Vec<String>,
    model: String,
    /// Where the part files are.
    dir: PathBuf,
    runs: Mutex<HashMap<String, Run>>,
}

impl LocalBatch {
    pub fn new(command: Vec<String>, model: &str, dir: &Path) -> LocalBatch {
        LocalBatch { command, model: model.to_string(), dir: dir.to_path_buf(), runs: Mutex::new(HashMap::new()) }
    }

    fn part_of(id: &str) -> &str {
        id.strip_prefix("local-").unwrap_or(id)
    }

    fn input(&self, part: &str) -> PathBuf {
        self.dir.join(format!("synth-{part}.jsonl"))
    }

    /// Where a part's results are when its command succeeded (or the user ran it).
    pub fn results(dir: &Path, part: &str) -> PathBuf {
        dir.join(format!("synth-{part}.results.jsonl"))
    }

    fn substitute(&self, args: &[String], input: &Path, output: &Path) -> Vec<String> {
        args.iter()
            .map(|a| {
                a.replace("{input}", &input.display().to_string())
                    .replace("{output}", &output.display().to_string())
                    .replace("{model}", &self.model)
            })
            .collect()
    }

    fn spawn(&self, part: &str) -> Result<(), LlmError> {
        let input = self.input(part);
        let tmp = self.dir.join(format!(".synth-tmp-{part}-{}.results.jsonl", std::process::id()));
        let args = self.substitute(&self.command, &input, &tmp);
        let log = std::fs::File::create(self.dir.join(format!("synth-{part}.log")))
            .map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("creating the batch command's log: {e}")))?;
        let log2 = log
            .try_clone()
            .map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("creating the batch command's log: {e}")))?;
        let child = tokio::process::Command::new(&args[0])
            .args(&args[1..])
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| {
                LlmError::new(ErrorKind::Unavailable, format!("cannot run the batch command `{}`: {e}", args.join(" ")))
            })?;
        tracing::info!("batch part {part}: running `{}`", args.join(" "));
        self.runs.lock().expect("runs").insert(part.to_string(), Run::Running(child, tmp));
        Ok(())
    }

    fn info(&self, part: &str, state: BatchState, failure: Option<String>) -> BatchInfo {
        let results = Self::results(&self.dir, part);
        let completed = match state {
            BatchState::Completed => std::fs::read(&results)
                .map(|b| b.split(|c| *c == b'\n').filter(|l| !l.is_empty()).count() as u64)
                .unwrap_or(0),
            _ => 0,
        };
        BatchInfo {
            id: format!("local-{part}"),
            state,
            total: 0,
            completed,
            failed: 0,
            output: (state == BatchState::Completed).then(|| results.display().to_string()),
            errors: None,
            failure: failure.map(|m| ("command_failed".to_string(), m)),
            created_at: now(),
            part: Some(part.to_string()),
        }
    }

    fn log_tail(&self, part: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(format!("synth-{part}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        synth_core::secrets::scrub(&lines[lines.len().saturating_sub(5)..].join(" | "))
    }
}

#[async_trait::async_trait]
impl BatchApi for LocalBatch {
    fn kind(&self) -> &'static str {
        "vllm"
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

    /// `vllm run-batch` has no limits of its own: OpenAI's, so parts stay the same size.
    fn limits(&self) -> (u64, u64) {
        super::batch::LIMITS
    }

    fn line(&self, key: &str, body: &BatchBody) -> String {
        synth_llm::batch::openai_line(key, body)
    }

    async fn upload(&self, _part: &PartRef) -> Result<Option<String>, LlmError> {
        Ok(None)
    }

    async fn find_file(&self, _part: &PartRef) -> Result<Option<String>, LlmError> {
        Ok(None)
    }

    async fn create(&self, part: &PartRef, _file: Option<&str>) -> Result<BatchInfo, LlmError> {
        if !self.command.is_empty() && !Self::results(&self.dir, &part.part).exists() {
            self.spawn(&part.part)?;
        }
        Ok(self.info(&part.part, BatchState::InProgress, None))
    }

    async fn find_batch(&self, _: &PartRef, _: u64, _: &HashSet<String>) -> Result<Option<BatchInfo>, LlmError> {
        Ok(None)
    }

    async fn retrieve(&self, id: &str) -> Result<BatchInfo, LlmError> {
        let part = Self::part_of(id).to_string();
        let results = Self::results(&self.dir, &part);
        if results.exists() {
            return Ok(self.info(&part, BatchState::Completed, None));
        }
        if self.command.is_empty() {
            return Ok(self.info(&part, BatchState::InProgress, None));
        }
        let mut runs = self.runs.lock().expect("runs");
        let outcome = match runs.get_mut(&part) {
            None => None,
            Some(Run::Failed(m)) => Some(Err(m.clone())),
            Some(Run::Running(child, tmp)) => match child.try_wait() {
                Ok(None) => return Ok(self.info(&part, BatchState::InProgress, None)),
                Ok(Some(status)) if status.success() => match std::fs::rename(&*tmp, &results) {
                    Ok(()) => Some(Ok(())),
                    Err(e) => Some(Err(format!("the command succeeded but left no output {}: {e}", tmp.display()))),
                },
                Ok(Some(status)) => {
                    Some(Err(format!("the batch command exited with {status}: {}", self.log_tail(&part))))
                }
                Err(e) => Some(Err(format!("waiting for the batch command: {e}"))),
            },
        };
        match outcome {
            Some(Ok(())) => {
                runs.remove(&part);
                Ok(self.info(&part, BatchState::Completed, None))
            }
            Some(Err(message)) => {
                runs.insert(part.clone(), Run::Failed(message.clone()));
                Ok(self.info(&part, BatchState::Failed, Some(message)))
            }
            None => {
                // Not started by this process (it restarted): run it again.
                drop(runs);
                self.spawn(&part)?;
                Ok(self.info(&part, BatchState::InProgress, None))
            }
        }
    }

    async fn cancel(&self, id: &str) -> Result<BatchInfo, LlmError> {
        let part = Self::part_of(id).to_string();
        if let Some(Run::Running(mut child, _)) = self.runs.lock().expect("runs").remove(&part) {
            let _ = child.start_kill();
        }
        Ok(self.info(&part, BatchState::Cancelled, None))
    }

    async fn download(&self, info: &BatchInfo) -> Result<Results, LlmError> {
        let Some(results) = &info.output else { return Ok(Results::default()) };
        let bytes = std::fs::read(results)
            .map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("reading {results}: {e}")))?;
        Ok(Results { output: Some(bytes.into()), errors: None })
    }

    fn parse_line(&self, line: &str) -> Result<(String, LineOutcome), String> {
        parse_openai_line(line)
    }

    fn external(&self, part: &PartRef) -> Option<String> {
        if !self.command.is_empty() {
            return None;
        }
        let results = Self::results(&self.dir, &part.part);
        let args: Vec<String> = DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect();
        Some(self.substitute(&args, &part.input, &results).join(" "))
    }
}
