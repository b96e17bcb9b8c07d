//! The open-model path against the loopback completions server: four echo + logprobs
//! requests per prompt, the continuation is the letter right after "答案："
//! (`target_delimiter = ""`), argmax with ties to the lower letter, and a re-run is
//! answered from the cache.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::support::openai_server::{self, Behaviour};
use crate::support::{Project, parquet_rows};

use super::repo;

#[test]
fn letters_are_scored_by_loglikelihood_through_the_cache() {
    // B and C are equally likely after "答案：", the others less: ties go to B.
    let server = openai_server::start(Behaviour {
        token_logprob: Arc::new(|before, token| {
            if before.ends_with("答案：") {
                match token {
                    "B" | "C" => -0.25,
                    _ => -3.0,
                }
            } else {
                -1.0
            }
        }),
        ..Default::default()
    });
    let p = Project::new();
    let demo = repo().join("pipelines/data/roleeval-demo");
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
name = "roleeval-loglik"
output_dir = "out"

[providers.open]
kind = "openai"
base_url = "{url}"
model = "test-model"
api_key_env = "SYNTH_TEST_KEY"

[stages.test]
kind = "roleeval_release"
path = "{demo}"
split = "test"
format = "{format}"
subsets = ["chinese"]

[stages.dev]
kind = "roleeval_release"
path = "{demo}"
split = "dev"
format = "{format}"
subsets = ["chinese"]

[stages.prompts]
kind = "roleeval_prompts"
inputs = ["test", "dev"]
format = "{format}"

[stages.open]
kind = "loglik"
inputs = ["prompts"]
provider = "open"
context = "prompt"
choices = ["A", "B", "C", "D"]
target_delimiter = ""
keep_columns = ["qkey", "shots"]

[stages.scores]
kind = "roleeval_score"
inputs = ["prompts", "open"]
format = "{format}"
key = "{demo}/key.csv"
"#,
            url = server.base_url(),
            demo = demo.display(),
            format = repo().join("pipelines/prompts/roleeval/zh.json").display(),
        ),
    );
    p.synth_env(&["run", "p.toml"], &[("SYNTH_TEST_KEY", "k")]).ok();
    let rows = parquet_rows(&p.path().join("out/open.parquet"));
    assert_eq!(rows.len(), 40, "20 questions x 2 settings");
    for r in &rows {
        assert_eq!(r["pred"], "B", "{}", r["id"]);
        assert_eq!(
            (r["ll_A"].as_f64(), r["ll_B"].as_f64(), r["ll_C"].as_f64()),
            (Some(-3.0), Some(-0.25), Some(-0.25))
        );
    }
    let c = &server.counters;
    assert_eq!(c.ok.load(Ordering::SeqCst), 160, "four requests per prompt");
    let log = c.log.lock().unwrap().clone();
    assert!(
        log.iter().all(|(_, prompt)| ["A", "B", "C", "D"].iter().any(|l| prompt.ends_with(&format!("\n答案：{l}"))))
    );
    let scores = parquet_rows(&p.path().join("out/scores.parquet"));
    let want = scores.iter().filter(|r| r["gold"] == "B").count();
    assert_eq!(scores.iter().filter(|r| r["correct"] == true).count(), want);

    // The stage's output lost: it runs again, every log-likelihood from the cache.
    std::fs::remove_file(p.path().join("out/open.parquet")).unwrap();
    p.synth_env(&["run", "p.toml"], &[("SYNTH_TEST_KEY", "k")]).ok();
    assert_eq!(c.ok.load(Ordering::SeqCst), 160, "no request sent twice");
    assert_eq!(parquet_rows(&p.path().join("out/open.parquet")), rows);
}
