//! `synth bench`: measurements anyone can re-run, each printing one JSON line.
//! `engine` times the engine itself: a Parquet source and a no-op map over N
//! records (records/s, peak RSS), then an up-to-date re-run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use synth_core::data::arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray};
use synth_core::data::arrow::datatypes::{DataType, Field, Schema};
use tokio_util::sync::CancellationToken;

use synth_core::progress::{Mode, ProgressHub};
use synth_runner::dag::runner::{RunOptions, run};
use synth_runner::pipeline::{LoadOptions, load};

/// Peak resident set size of this process in MiB (Linux VmHWM).
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Reset the peak RSS counter so a measurement excludes setup (Linux only).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// CPU seconds (user + system) used by this process so far.
pub fn cpu_seconds() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

fn write_records(path: &Path, n: usize) -> Result<()> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("text", DataType::Utf8, false),
        Field::new("n", DataType::Int64, false),
        Field::new("score", DataType::Float64, false),
    ]));
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let props = synth_core::store::parquet::writer_properties(vec![]);
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), Some(props))?;
    let chunk = 65_536;
    let mut start = 0;
    while start < n {
        let len = chunk.min(n - start);
        let ids = start..start + len;
        let text: StringArray =
            ids.clone().map(|i| Some(format!("record {i}: a short line of text standing in for a prompt"))).collect();
        let nums: Int64Array = ids.clone().map(|i| Some(i as i64)).collect();
        let scores: Float64Array = ids.map(|i| Some((i % 1000) as f64 / 1000.0)).collect();
        w.write(&RecordBatch::try_new(schema.clone(), vec![Arc::new(text), Arc::new(nums), Arc::new(scores)])?)?;
        start += len;
    }
    w.close()?;
    Ok(())
}

/// Engine overhead: source + no-op map over `records` records, then an up-to-date re-run.
pub fn engine(records: usize, dir: Option<PathBuf>) -> Result<serde_json::Value> {
    let cleanup = dir.is_none();
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            d
        }
        None => tempdir()?,
    };
    let result = engine_in(records, &dir);
    if cleanup {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn engine_in(records: usize, dir: &Path) -> Result<serde_json::Value> {
    let data = dir.join("records.parquet");
    write_records(&data, records)?;
    let pipeline = dir.join("bench.toml");
    std::fs::write(
        &pipeline,
        "[pipeline]\nname = \"bench\"\noutput_dir = \"out\"\n\n\
         [stages.records]\nkind = \"source\"\npath = \"records.parquet\"\n\n\
         [stages.noop]\nkind = \"map\"\ninputs = [\"records\"]\n",
    )?;
    let out_dir = dir.join("out");
    let _ = std::fs::remove_dir_all(&out_dir);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let run_once = |label: &str| -> Result<(f64, synth_runner::dag::runner::RunSummary)> {
        let (p, diags) = load(&pipeline, &LoadOptions::default(), crate::registry::registry());
        let p = Arc::new(p.with_context(|| format!("bench pipeline invalid: {diags}"))?);
        let opts = RunOptions { out_dir: out_dir.clone(), ..Default::default() };
        let started = Instant::now();
        let summary = runtime
            .block_on(run(p, opts, ProgressHub::new(Mode::Quiet), CancellationToken::new()))
            .map_err(|e| anyhow::anyhow!("{label} run failed: {e}"))?;
        Ok((started.elapsed().as_secs_f64(), summary))
    };
    reset_peak_rss();
    let cpu0 = cpu_seconds();
    let (first_secs, summary) = run_once("first")?;
    let cpu = cpu_seconds() - cpu0;
    let peak = peak_rss_mib();
    let report = |name: &str| summary.lines.iter().find(|l| l.stage == name).and_then(|l| l.report.clone());
    let source = report("records").context("source report")?;
    let noop = report("noop").context("map report")?;
    let (rerun_secs, rerun) = run_once("up-to-date")?;
    anyhow::ensure!(rerun.n_ran() == 0, "the re-run was not up to date");
    let output_bytes = std::fs::metadata(out_dir.join("noop.parquet")).map(|m| m.len()).unwrap_or(0);
    Ok(serde_json::json!({
        "bench": "engine",
        "records": records,
        "source_seconds": round(source.wall_seconds),
        "source_records_per_s": round(records as f64 / source.wall_seconds),
        "noop_map_seconds": round(noop.wall_seconds),
        "noop_map_records_per_s": round(records as f64 / noop.wall_seconds),
        "run_seconds": round(first_secs),
        "run_cpu_seconds": round(cpu),
        "peak_rss_mib": peak.map(round),
        "output_mib": round(output_bytes as f64 / (1024.0 * 1024.0)),
        "up_to_date_rerun_seconds": round(rerun_secs),
    }))
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn tempdir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("synth-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Settings of `synth bench llm` (its command-line arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct LlmBench {
    /// OpenAI-compatible API base, e.g. http://127.0.0.1:18080/v1
    #[arg(long)]
    pub base_url: String,
    #[arg(long)]
    pub model: String,
    #[arg(long, default_value_t = 1000)]
    pub requests: usize,
    /// Client-side requests-per-minute limit.
    #[arg(long)]
    pub rpm: Option<u32>,
    /// Ignore the limits the server advertises in x-ratelimit-* headers.
    #[arg(long)]
    pub no_learn_limits: bool,
    /// Most requests in flight.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// Per-request timeout, seconds.
    #[arg(long = "timeout", default_value_t = 60.0)]
    pub timeout_seconds: f64,
    /// Environment variable holding the API key.
    #[arg(long, default_value = "OPENAI_API_KEY")]
    pub api_key_env: String,
    /// Measure this machine's floor instead: the same requests, paced the same way, from
    /// a bare reqwest client on one thread (no cache, journal, limiter or async-openai).
    #[arg(long)]
    pub baseline: bool,
}

/// Options of an option list with their defaults filled in.
fn defaults_of(specs: &[synth_core::config::options::OptionSpec]) -> serde_json::Map<String, serde_json::Value> {
    specs.iter().filter_map(|s| s.default_json().map(|d| (s.name.to_string(), d))).collect()
}

/// Send N distinct chat requests through the provider layer the stages use (rate
/// control, retries, journal and cache writes) and report throughput and cost.
pub fn llm(args: &LlmBench) -> Result<serde_json::Value> {
    use futures::StreamExt;

    use synth_core::config::decl::Decl;
    use synth_engine::services::Services;
    use synth_llm::{CallCtx, ChatRequest, Message};

    let dir = tempdir()?;
    // The kind this benchmark measures: the registry's `openai`.
    let registry = crate::registry::registry();
    let openai = registry.provider("openai").ok_or_else(|| anyhow::anyhow!("no \"openai\" provider kind"))?;
    let mut options = defaults_of(openai.kind.options);
    options.insert("base_url".into(), args.base_url.clone().into());
    options.insert("model".into(), args.model.clone().into());
    options.insert("api_key_env".into(), args.api_key_env.clone().into());
    options.insert("max_tokens".into(), args.max_tokens.into());
    options.insert("max_concurrency".into(), args.concurrency.into());
    options.insert("initial_concurrency".into(), args.concurrency.into());
    options.insert("timeout_seconds".into(), args.timeout_seconds.into());
    if let Some(rpm) = args.rpm {
        options.insert("requests_per_minute".into(), rpm.into());
    }
    options.insert("learn_limits".into(), (!args.no_learn_limits).into());
    let decl = Decl { name: "bench".into(), kind: openai.name().into(), options: serde_json::Value::Object(options) };
    let services =
        Services::new(&dir, &dir, [("bench".to_string(), decl)].into(), Default::default(), registry.catalog());
    // The same runtimes `synth run` uses: the engine's, and the network runtime that
    // network-bound stages (an `llm` stage on an `openai` provider) run on.
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let provider = services.provider("bench")?;
    let net = services.net()?;
    let call = CallCtx::new("bench", "bench", synth_core::progress::StageProgress::new("bench"));
    let nonce: u64 = rand::random();
    reset_peak_rss();
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let (services2, provider2, call2) = (services.clone(), provider.clone(), call.clone());
    let (n_requests, conc) = (args.requests, args.concurrency);
    // Drive the requests from a task where an `llm` stage on this provider runs.
    let results: Vec<bool> = runtime.block_on(async move {
        let (services, provider, call) = (services2, provider2, call2);
        let args = (n_requests, conc);
        net.run(async move {
            futures::stream::iter(0..args.0)
                .map(|i| {
                    let req = ChatRequest {
                        messages: vec![Message::new(
                            synth_llm::Role::User,
                            format!("Benchmark request {i} ({nonce:x}): reply with one short sentence."),
                        )],
                        params: Default::default(),
                        sample: 0,
                        expect: "text".into(),
                        structured: None,
                    };
                    let (services, provider, call) = (services.clone(), provider.clone(), call.clone());
                    async move { services.chat(&provider, req, &call).await.is_ok() }
                })
                .buffer_unordered(args.1.max(1) * 2)
                .collect::<Vec<bool>>()
                .await
        })
        .await
        .unwrap_or_default()
    });
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let peak = peak_rss_mib();
    let ok = results.iter().filter(|r| **r).count();
    let stats = &provider.rate.stats;
    use std::sync::atomic::Ordering::Relaxed;
    let achieved = ok as f64 / wall;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(serde_json::json!({
        "bench": "llm",
        "requests": args.requests,
        "ok": ok,
        "failed": args.requests - ok,
        "wall_seconds": round(wall),
        "requests_per_second": round(achieved),
        "limit_requests_per_second": args.rpm.map(|r| round(r as f64 / 60.0)),
        "fraction_of_limit": args.rpm.map(|r| round(achieved / (r as f64 / 60.0))),
        "sent": stats.sent.load(Relaxed),
        "retries": stats.retries.load(Relaxed),
        "http_429": stats.rate_limited.load(Relaxed),
        "limits": provider.rate.limits().into_iter().collect::<std::collections::BTreeMap<_, _>>(),
        "timeouts": stats.timeouts.load(Relaxed),
        "client_cpu_seconds": round(cpu),
        "cpu_ms_per_request": round(cpu * 1000.0 / args.requests.max(1) as f64),
        "peak_rss_mib": peak.map(round),
    }))
}

/// The floor of this machine for `llm`'s workload: the same N requests, paced by a
/// plain interval at `rpm` and bounded to `concurrency` in flight, sent by a bare reqwest
/// client on a current-thread runtime. What `llm` adds over this is synth's own cost.
pub fn llm_baseline(args: &LlmBench) -> Result<serde_json::Value> {
    let key = std::env::var(&args.api_key_env).unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let nonce: u64 = rand::random();
    reset_peak_rss();
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let (n, conc, max_tokens) = (args.requests, args.concurrency.max(1), args.max_tokens);
    let period = args.rpm.map(|r| std::time::Duration::from_secs_f64(60.0 / r.max(1) as f64));
    let (base_url, model) = (args.base_url.clone(), args.model.clone());
    let ok = runtime.block_on(async move {
        let mut tick = period.map(tokio::time::interval);
        let slots = Arc::new(tokio::sync::Semaphore::new(conc));
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            if let Some(t) = tick.as_mut() {
                t.tick().await;
            }
            let permit = slots.clone().acquire_owned().await.expect("open");
            let (http, base_url, key) = (http.clone(), base_url.clone(), key.clone());
            let body = serde_json::json!({
                "model": model,
                "messages": [{"role": "user", "content": format!("Benchmark request {i} ({nonce:x}): reply with one short sentence.")}],
                "max_tokens": max_tokens,
            });
            set.spawn(async move {
                let ok = synth_llm::openai::bare_chat(&http, &base_url, &key, &body).await;
                drop(permit);
                ok
            });
        }
        let mut ok = 0usize;
        while let Some(r) = set.join_next().await {
            ok += usize::from(r.unwrap_or(false));
        }
        ok
    });
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    Ok(serde_json::json!({
        "bench": "llm-baseline",
        "requests": n,
        "ok": ok,
        "failed": n - ok,
        "wall_seconds": round(wall),
        "requests_per_second": round(ok as f64 / wall),
        "client_cpu_seconds": round(cpu),
        "cpu_ms_per_request": round(cpu * 1000.0 / n.max(1) as f64),
        "peak_rss_mib": peak_rss_mib().map(round),
    }))
}

/// Passages per second of an embedder on generated passages of about `words` words.
pub fn embed(
    model_dir: &Path,
    passages: usize,
    words: usize,
    batch: usize,
    ort: Option<&str>,
) -> Result<serde_json::Value> {
    use rand::{RngExt, SeedableRng};
    const VOCAB: &[&str] = &[
        "river",
        "market",
        "engine",
        "harvest",
        "signal",
        "garden",
        "teacher",
        "protein",
        "voltage",
        "museum",
        "recipe",
        "planet",
        "contract",
        "violin",
        "glacier",
        "software",
        "mineral",
        "festival",
        "insurance",
        "weather",
        "bridge",
        "doctor",
        "language",
        "history",
        "battery",
        "football",
        "painting",
        "volcano",
        "library",
        "village",
    ];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let texts: Vec<String> = (0..passages)
        .map(|_| (0..words).map(|_| VOCAB[rng.random_range(0..VOCAB.len())]).collect::<Vec<_>>().join(" "))
        .collect();
    let options = serde_json::json!({
        "model_dir": model_dir.to_string_lossy(), "pooling": "mean", "max_length": 256, "dim": 384,
        "batch_size": batch, "ort_dylib": ort,
    });
    let cwd = std::env::current_dir()?;
    let e = synth_embed::fastembed::FastEmbed::from_options("bench", &options, &cwd)?;
    // Load the model outside the measurement.
    e.embed_blocking(&texts[..1])?;
    reset_peak_rss();
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let out = e.embed_blocking(&texts)?;
    let wall = started.elapsed().as_secs_f64();
    anyhow::ensure!(out.len() == passages, "got {} vectors", out.len());
    Ok(serde_json::json!({
        "bench": "embed",
        "model_dir": model_dir.display().to_string(),
        "passages": passages,
        "words_per_passage": words,
        "batch_size": batch,
        "wall_seconds": round(wall),
        "passages_per_second": round(passages as f64 / wall),
        "cpu_seconds": round(cpu_seconds() - cpu0),
        "peak_rss_mib": peak_rss_mib().map(round),
    }))
}

pub struct RetrieveBench {
    pub queries: usize,
    pub passages: usize,
    pub dim: usize,
    /// "exact" (the GEMM search, with its sgemm peak) or "hnsw".
    pub method: String,
    /// The GEMM shape of the exact search.
    pub tiles: synth_retrieval::gemm::Tiles,
    pub seed: u64,
    pub threads: Option<usize>,
    pub recall_sample: usize,
}

/// Exact (or HNSW) most/least similar passage per query on seeded random unit vectors.
/// Effective GFLOP/s counts the 2·Q·N·D multiply-adds of the full score matrix.
pub fn retrieve(a: &RetrieveBench) -> Result<serde_json::Value> {
    use synth_retrieval as retrieval;
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let queries = retrieval::random_unit_vectors(a.queries, a.dim, a.seed);
    if a.method != "hnsw" {
        let t = Instant::now();
        let mut corpus = retrieval::gemm::RowCorpus::with_capacity(a.dim, a.passages);
        for v in retrieval::random_unit_vectors(a.passages, a.dim, a.seed ^ 0x9e37_79b9).chunks_exact(a.dim) {
            corpus.push(v, true, true);
        }
        let load_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let res = retrieval::gemm::exact_max_min_tiled(&queries, &corpus, threads, a.tiles);
        let wall = t.elapsed().as_secs_f64();
        std::hint::black_box(&res);
        let flop = 2.0 * a.queries as f64 * a.passages as f64 * a.dim as f64;
        let gflops = flop / wall / 1e9;
        // The same GEMM call without the fold, on this machine, in this run: the peak.
        let peak = retrieval::gemm::sgemm_peak(a.dim, threads, 3.0, a.tiles);
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        // Fewer queries than a block: every GEMM of the search has that many rows, so
        // the peak of that shape too (reported beside the full block's, not instead).
        let small = (a.queries < a.tiles.query_block).then(|| {
            let rows = synth_retrieval::gemm::Tiles { query_block: a.queries.max(1), ..a.tiles };
            let p = retrieval::gemm::sgemm_peak(a.dim, threads, 3.0, rows);
            serde_json::json!({ "query_rows": a.queries, "sgemm_peak_gflops": round(p), "ratio_to_peak": round(gflops / p) })
        });
        return Ok(serde_json::json!({
            "bench": "retrieve", "method": "exact", "kernel": retrieval::gemm::kernel_name(), "threads": threads,
            "query_block": a.tiles.query_block, "corpus_tile": a.tiles.corpus_tile,
            "queries": a.queries, "passages": a.passages, "dim": a.dim, "seed": a.seed,
            "generate_and_pack_seconds": round(load_s), "wall_seconds": round(wall), "gflops": round(gflops),
            "sgemm_peak_gflops": round(peak), "ratio_to_peak": round(gflops / peak),
            "same_rows_peak": small,
            "peak_rss_mib": peak_rss_mib().map(round),
        }));
    }
    let passages = retrieval::random_unit_vectors(a.passages, a.dim, a.seed ^ 0x9e37_79b9);
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let n = a.passages;
    let corpus = retrieval::gemm::RowCorpus::from_rows(&passages, a.dim);
    drop(passages);
    let t = Instant::now();
    let index = retrieval::hnsw::Hnsw::build(
        corpus.rows(),
        a.dim,
        vec![true; n],
        vec![true; n],
        retrieval::hnsw::HnswParams::default(),
        threads,
    )?;
    let build_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let approx = index.max_min(&queries, threads)?;
    let search_s = t.elapsed().as_secs_f64();
    let sample = a.recall_sample.min(a.queries);
    let exact = retrieval::gemm::exact_max_min(&queries[..sample * a.dim], &corpus, threads);
    let (rmax, rmin) = retrieval::hnsw::recall(&approx[..sample], &exact);
    Ok(serde_json::json!({
        "bench": "retrieve", "method": "hnsw", "threads": threads,
        "queries": a.queries, "passages": a.passages, "dim": a.dim, "seed": a.seed,
        "build_seconds": round(build_s), "search_seconds": round(search_s), "wall_seconds": round(build_s + search_s),
        "recall_sample": sample, "recall_max": round(rmax), "recall_min": round(rmin),
        "peak_rss_mib": peak_rss_mib().map(round),
    }))
}

/// Write a stage-like Parquet file of `rows` chat samples (id, category, a three-message
/// `conversations` list, `reply_words`), with the stages' writer settings.
/// GET `url`: milliseconds to its parsed JSON answer, and the answer (an error unless 2xx).
async fn timed_get(http: &reqwest::Client, url: &str) -> Result<(f64, serde_json::Value)> {
    let t = Instant::now();
    let r = http.get(url).send().await?;
    let status = r.status();
    let body: serde_json::Value = r.json().await?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(status.is_success(), "GET {url}: {status}: {body}");
    Ok((ms, body))
}

fn write_chat_samples(path: &Path, rows: usize) -> Result<()> {
    use synth_core::data::arrow::datatypes::Fields;
    let message =
        Fields::from(vec![Field::new("role", DataType::Utf8, false), Field::new("content", DataType::Utf8, false)]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("category", DataType::Utf8, false),
        Field::new(
            "conversations",
            DataType::List(Arc::new(Field::new("item", DataType::Struct(message), true))),
            true,
        ),
        Field::new("reply_words", DataType::Float64, true),
    ]));
    const WORDS: &[&str] = &[
        "the", "captain", "looked", "at", "harbour", "storm", "quietly", "answered", "about", "ship", "river", "old",
        "letter", "friend", "night", "castle", "garden", "secret", "promise", "morning", "lantern", "road", "song",
        "winter", "market", "bridge", "tower", "sword", "book", "candle", "window", "mountain",
    ];
    use rand::{RngExt, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer = parquet::arrow::ArrowWriter::try_new(
        file,
        schema.clone(),
        Some(synth_core::store::parquet::writer_properties(vec![])),
    )?;
    let mut done = 0;
    while done < rows {
        let n = (rows - done).min(8192);
        let mut json = String::new();
        for i in done..done + n {
            let mut text = |words: usize| -> String {
                (0..words).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect::<Vec<_>>().join(" ")
            };
            let (system, user, reply) = (text(20), text(25), text(60));
            // One row in 50,000 mentions a rare word: what a text filter looks for.
            let reply = if i % 50_000 == 7 { format!("{reply} zephyr") } else { reply };
            let category = ["single", "multi", "refusal", "nested"][i % 4];
            let line = serde_json::json!({
                "id": format!("s{i:07}"),
                "category": category,
                "conversations": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": user},
                    {"role": "assistant", "content": reply},
                ],
                "reply_words": 40.0 + (i * 7919 % 1000) as f64 / 10.0,
            });
            json.push_str(&line.to_string());
            json.push('\n');
        }
        let mut decoder =
            synth_core::data::arrow::json::ReaderBuilder::new(schema.clone()).with_batch_size(n).build_decoder()?;
        decoder.decode(json.as_bytes())?;
        if let Some(batch) = decoder.flush()? {
            writer.write(&batch)?;
        }
        done += n;
    }
    writer.close()?;
    Ok(())
}

/// `synth view` on a big stage output: wall time of the table endpoint for the first
/// page, page 1,000, a page near the end, the first and 1,000th page sorted by a column
/// (the first computes the order) and filtered by a rare word (the first answer, then asked
/// again as the page does until the count is final); the server's peak RSS while
/// browsing (the file's generation excluded).
pub fn view(rows: usize, dir: Option<PathBuf>) -> Result<serde_json::Value> {
    let owned = dir.is_none();
    let dir = match dir {
        Some(d) => d,
        None => tempdir()?,
    };
    std::fs::create_dir_all(dir.join(synth_core::store::state::INTERNAL_DIR).join("state"))?;
    let file = dir.join("samples.parquet");
    let gen0 = Instant::now();
    if std::fs::metadata(&file).map(|m| m.len() == 0).unwrap_or(true)
        || synth_core::store::parquet::read_footer(&file).map(|f| f.num_rows as usize != rows).unwrap_or(true)
    {
        write_chat_samples(&file, rows)?;
    }
    let generate = gen0.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&file)?.len();
    let viewed = synth_view::Viewed::dir(&dir, None)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    reset_peak_rss();
    let rss0 = peak_rss_mib();
    let timings = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, synth_view::router(viewed)).await });
        let http = reqwest::Client::new();
        let mut out = serde_json::Map::new();
        let pages = [
            ("first_page", "offset=0"),
            ("page_1000", "offset=49950"),
            ("page_near_end", "offset=LAST"),
            ("sorted_first_page", "sort=reply_words&offset=0"),
            ("sorted_page_1000", "sort=reply_words&offset=49950"),
            ("filtered_first_page", "q=zephyr&offset=0"),
            ("filtered_again", "q=zephyr&offset=0"),
            ("page_1000_again", "offset=49950"),
        ];
        let mut paging_peak = None;
        for (name, query) in pages {
            let query = query.replace("LAST", &rows.saturating_sub(50).to_string());
            if name == "sorted_first_page" {
                paging_peak = peak_rss_mib();
            }
            let t = Instant::now();
            let (ms, body) = timed_get(&http, &format!("http://{addr}/api/table?file=samples.parquet&limit=50&{query}")).await?;
            out.insert(
                name.into(),
                serde_json::json!({"ms": round(ms), "rows": body["data"].as_array().map(|a| a.len()), "matched": body["matched"], "complete": body["complete"]}),
            );
            if body["complete"] == false {
                // As the page does: ask again until the search is complete; the time from the first ask.
                let mut asks = 1;
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    let r = http.get(format!("http://{addr}/api/table?file=samples.parquet&limit=50&{query}")).send().await?;
                    let body: serde_json::Value = r.json().await?;
                    asks += 1;
                    if body["complete"] == true {
                        let ms = t.elapsed().as_secs_f64() * 1000.0;
                        out.insert(
                            format!("{name}_complete"),
                            serde_json::json!({"ms": round(ms), "rows": body["data"].as_array().map(|a| a.len()), "matched": body["matched"], "asks": asks}),
                        );
                        break;
                    }
                }
            }
        }
        out.insert("peak_rss_after_paging_mib".into(), serde_json::json!(paging_peak.map(round)));
        // Facets of one column (value counts, or a histogram of lengths / numbers), each a
        // fresh request (nothing cached), then the first page filtered by one bar.
        for column in ["category", "reply_words", "conversations", "id"] {
            let (ms, body) = timed_get(&http, &format!("http://{addr}/api/facets?file=samples.parquet&column={column}")).await?;
            out.insert(format!("facets_{column}"), serde_json::json!({"ms": round(ms), "kind": body["kind"]}));
        }
        let filter = serde_json::json!({"column": "category", "eq": "refusal"}).to_string();
        let t = Instant::now();
        let url = reqwest::Url::parse_with_params(
            &format!("http://{addr}/api/table?file=samples.parquet&limit=50"),
            &[("facet", filter.as_str())],
        )?;
        let r = http.get(url).send().await?;
        let body: serde_json::Value = r.json().await?;
        out.insert(
            "facet_filtered_first_page".into(),
            serde_json::json!({"ms": round(t.elapsed().as_secs_f64() * 1000.0), "matched": body["matched"]}),
        );
        anyhow::Ok(out)
    })?;
    let peak = peak_rss_mib();
    if owned {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(serde_json::json!({
        "bench": "view",
        "rows": rows,
        "file_mib": round(bytes as f64 / (1 << 20) as f64),
        "generate_seconds": round(generate),
        "requests": timings,
        "rss_before_mib": rss0.map(round),
        "peak_rss_browsing_mib": peak.map(round),
    }))
}
