//! CharacterBench prompt rendering throughput: every record of a release directory read and
//! normalized (both languages), then every official judge prompt rendered (human-agreement
//! mode: the shipped response), `--repeat` times; one thread. Prints one JSON line with the
//! rates and the SHA-256 of all judge prompts in order, which
//! `benches/characterbench_render.py` (the official builder's logic in Python) must match:
//!
//!     cargo bench --bench characterbench_render -- --dir ../shared/data/characterbench/eval_data/raw_data --repeat 20
//!     python3 benches/characterbench_render.py ../shared/data/characterbench/eval_data/raw_data 20

use std::time::Instant;

// The synth binary's allocator (src/main.rs), so the numbers are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use sha2::{Digest, Sha256};
use synth::methods::characterbench::bench::Bench;
use synth::methods::characterbench::{prompts, release};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let dir = std::path::PathBuf::from(
        get("--dir").unwrap_or_else(|| "../shared/data/characterbench/eval_data/raw_data".into()),
    );
    let repeat: usize = get("--repeat").and_then(|r| r.parse().ok()).unwrap_or(20);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let bench = Bench::read(&root.join("pipelines/prompts/characterbench/dimensions.json")).expect("definition");
    let langs = vec!["zh".to_string(), "en".to_string()];

    let t0 = Instant::now();
    let mut items = Vec::new();
    for d in &bench.dimensions {
        let path = dir.join(format!("{}_test.json", d.id));
        if path.exists() {
            let (mut got, problems) = release::read_file(&path, d, &bench, &langs).expect("readable");
            assert!(problems.is_empty(), "{problems:?}");
            items.append(&mut got);
        }
    }
    let read_s = t0.elapsed().as_secs_f64();

    let render_all = |digest: Option<&mut Sha256>| {
        let mut digest = digest;
        let mut bytes = 0usize;
        for item in &items {
            let p = prompts::judge_item(&bench, item, item.response.as_deref().unwrap_or_default()).expect("renders");
            bytes += p.len();
            if let Some(h) = digest.as_deref_mut() {
                h.update(p.as_bytes());
            }
        }
        bytes
    };
    let mut h = Sha256::new();
    render_all(Some(&mut h));
    let digest: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let t1 = Instant::now();
    let mut bytes = 0;
    for _ in 0..repeat {
        bytes += render_all(None);
    }
    let render_s = t1.elapsed().as_secs_f64();
    let n = items.len();
    println!(
        "{{\"records\": {n}, \"read_normalize_s\": {read_s:.4}, \"render_s\": {render_s:.4}, \"repeat\": {repeat}, \"judge_prompts_per_s\": {:.0}, \"mb_per_s\": {:.1}, \"end_to_end_prompts_per_s\": {:.0}, \"sha256\": \"{digest}\"}}",
        (n * repeat) as f64 / render_s,
        bytes as f64 / render_s / 1e6,
        n as f64 / (read_s + render_s / repeat as f64),
    );
}
