//! Bad input, each named by file, record id and field (or a counted fallback), nothing lost:
//! a last turn that is not the user's, an unknown speaker, a missing `translation_en`, a
//! human score off the scale, a judge reply that is not a number, a dimension file the scale
//! table does not know, a file that is not JSON.

use serde_json::Value;

use super::{demo_release, failures, repo};
use crate::support::openai_server::{self, Behaviour};
use crate::support::{Project, parquet_rows};

/// A copy of one demo file, changed by `edit`, in `<project>/release/`.
fn release_with(p: &Project, dim: &str, edit: impl FnOnce(&mut Vec<Value>)) -> Vec<Value> {
    let text = std::fs::read_to_string(demo_release().join(format!("{dim}_test.json"))).unwrap();
    let mut records: Vec<Value> = serde_json::from_str(&text).unwrap();
    edit(&mut records);
    p.write(&format!("release/{dim}_test.json"), serde_json::to_string_pretty(&records).unwrap());
    records
}

fn pipeline(p: &Project, extra: &str) {
    let toml = format!(
        "[pipeline]\nname = \"cb\"\nseed = 1\nroot = {:?}\nmax_failure_ratio = 1.0\n\n[stages.release]\nkind = \"characterbench_release\"\npath = {:?}\n{extra}",
        repo().to_string_lossy(),
        p.path().join("release").to_string_lossy()
    );
    p.write("p.toml", toml);
}

#[test]
fn bad_records_go_to_failures_naming_file_record_and_field() {
    let p = Project::new();
    let records = release_with(&p, "memory_consistency", |r| {
        // Record 1: the character speaks last (zh); record 2: an unknown speaker (zh);
        // record 3: no English copy; record 4: a human score off the 1..4 scale.
        r[1]["dialogue"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"turn": 9, "speaker": "character", "utterance": "还有呢？"}));
        r[2]["dialogue"][1]["speaker"] = Value::from("路人甲");
        r[3].as_object_mut().unwrap().remove("translation_en");
        r[4]["gold"] = Value::from(7);
    });
    let id = |i: usize| records[i]["id"].to_string();
    pipeline(&p, "");
    p.synth(&["run", "p.toml", "--out", "out"]).ok();
    let out = p.path().join("out");
    let rows = parquet_rows(&out.join("release.parquet"));
    let fails = failures(&out, "release");
    let file = "release/memory_consistency_test.json";
    let find = |key: String| {
        fails.iter().find(|f| f["id"] == key.as_str()).unwrap_or_else(|| panic!("{key}: {fails:?}")).clone()
    };

    let f = find(format!("memory_consistency/{}/zh", id(1)));
    let m = f["message"].as_str().unwrap();
    assert!(m.contains(file) && m.contains(&format!("record {}", id(1))), "{m}");
    assert!(m.contains("field \"dialogue[") && m.contains("the last turn is the character's"), "{m}");
    assert_eq!(f["kind"], "bad_record");

    let m = find(format!("memory_consistency/{}/zh", id(2)))["message"].as_str().unwrap().to_string();
    assert!(m.contains("field \"dialogue[1].speaker\"") && m.contains("unknown speaker \"路人甲\""), "{m}");

    let m = find(format!("memory_consistency/{}/en", id(3)))["message"].as_str().unwrap().to_string();
    assert!(m.contains(&format!("record {}", id(3))) && m.contains("field \"translation_en\": missing"), "{m}");
    assert!(
        rows.iter().any(|r| r["id"] == format!("memory_consistency/{}/zh", id(3)).as_str()),
        "its Chinese record is still read"
    );

    let m = find(format!("memory_consistency/{}/zh", id(4)))["message"].as_str().unwrap().to_string();
    assert!(m.contains("field \"gold\"") && m.contains("outside memory_consistency's scale 1..=4"), "{m}");

    // Nothing lost: every (record, language) is a row or a failure, and failures keep the record.
    assert_eq!(rows.len() + fails.len(), records.len() * 2, "{fails:?}");
    assert!(fails.iter().all(|f| f["record"].as_str().is_some_and(|r| r.contains("\"dialogue\""))));
}

#[test]
fn an_unknown_dimension_file_or_a_broken_file_stops_the_stage_naming_it() {
    let p = Project::new();
    release_with(&p, "engagement", |_| {});
    p.write("release/charisma_test.json", "[]");
    pipeline(&p, "");
    let r = p.synth(&["run", "p.toml", "--out", "out"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("charisma_test.json: dimension \"charisma\" is not in the scale table"), "{}", r.stderr);

    std::fs::remove_file(p.path().join("release/charisma_test.json")).unwrap();
    p.write("release/engagement_test.json", "[\n  {\"id\": 1,\n  \"dialogue\": [}\n]");
    let r = p.synth(&["run", "p.toml", "--out", "out"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("engagement_test.json:3:") && r.stderr.contains("not valid JSON"), "{}", r.stderr);
}

#[test]
fn judge_replies_that_are_not_numbers_fall_back_counted_or_fail_when_strict() {
    let p = Project::new();
    release_with(&p, "human_likeness", |r| r.truncate(4));
    // The loopback judge: by sample seed, a bare number, a number and a reason, a score
    // written as text (the official 3.0 fallback), a first line that is not a number.
    let server = openai_server::start(Behaviour {
        responder: std::sync::Arc::new(|body: &Value| {
            let prompt = openai_server::last_user(body);
            let k = (prompt.len() + body["seed"].as_u64().unwrap_or(0) as usize) % 4;
            ["4", "2\nThe reply is natural.", "评分：2", "Score\n5"][k].to_string()
        }),
        ..Default::default()
    });
    let stages = |parser: &str| {
        format!(
            "\n[providers.judge]\nkind = \"openai\"\nbase_url = {:?}\nmodel = \"judge\"\napi_key_env = \"CB_KEY\"\n\n\
             [stages.prompts]\nkind = \"characterbench_judge\"\ninputs = [\"release\"]\n\n\
             [stages.judged]\nkind = \"llm\"\ninputs = [\"prompts\"]\nprovider = \"judge\"\nmessages = \"judge_messages\"\n\
             parser = \"number\"\nparser_options = {parser}\nn = 4\nmax_attempts = 1\nkeep_columns = [\"dimension\", \"lang\", \"gold\"]\n\n\
             [stages.scores]\nkind = \"aggregate\"\ninputs = [\"judged\"]\ncolumn = \"score\"\ncount = [\"score_fallback\"]\n\n\
             [stages.bench]\nkind = \"characterbench_score\"\ninputs = [\"scores\", \"prompts\"]\nlabel = \"m\"\n",
            server.base_url()
        )
    };
    pipeline(&p, &stages("{ fallback = 3.0, seed_hint = 0 }"));
    let r = p.synth_env(&["run", "p.toml", "--out", "out"], &[("CB_KEY", "k")]);
    assert_ne!(r.code, 0, "an unknown parser option is a config error");
    assert!(r.stderr.contains("unknown option \"seed_hint\" of parser \"number\""), "{}", r.stderr);

    pipeline(&p, &stages("{ fallback = 3.0 }"));
    p.synth_env(&["run", "p.toml", "--out", "out"], &[("CB_KEY", "k")]).ok();
    let out = p.path().join("out");
    let judged = parquet_rows(&out.join("judged.parquet"));
    assert_eq!(judged.len(), 4 * 2 * 4);
    let fell: usize = judged.iter().filter(|j| j["score_fallback"] == true).count();
    for j in &judged {
        let raw = j["raw"].as_str().unwrap();
        let want = match raw {
            "4" => 4.0,
            r if r.starts_with("2\n") => 2.0,
            _ => 3.0,
        };
        assert_eq!(j["score"].as_f64(), Some(want), "{raw:?}");
        assert_eq!(j["score_fallback"] == true, want == 3.0, "{raw:?}");
    }
    assert!(fell > 0, "some answers fell back");
    let scores = parquet_rows(&out.join("scores.parquet"));
    assert_eq!(scores.iter().map(|s| s["score_fallback_count"].as_i64().unwrap() as usize).sum::<usize>(), fell);
    let bench = parquet_rows(&out.join("bench.parquet"));
    assert_eq!(
        bench.iter().map(|b| b["fallback_samples"].as_i64().unwrap() as usize).sum::<usize>(),
        fell,
        "counted and reported"
    );
    assert!(failures(&out, "judged").is_empty());

    // Without a fallback, an answer that is not a number fails its record with the reason.
    pipeline(&p, &stages("{ mode = \"first_line\" }"));
    p.synth_env(&["run", "p.toml", "--out", "strict"], &[("CB_KEY", "k")]).ok();
    let strict = p.path().join("strict");
    let fails = failures(&strict, "judged");
    assert!(!fails.is_empty());
    assert!(fails.iter().all(|f| f["kind"] == "validation"), "{fails:?}");
    assert!(fails.iter().any(|f| f["message"].as_str().unwrap().contains("not a number")), "{fails:?}");
    let kept = parquet_rows(&strict.join("judged.parquet")).len() / 4;
    assert_eq!(kept + fails.len(), 8, "every record is judged or a failure");
    let bench = parquet_rows(&strict.join("bench.parquet"));
    let missing: i64 = bench.iter().map(|b| b["missing"].as_i64().unwrap()).sum();
    assert_eq!(missing as usize, fails.len(), "records without a score are counted as missing");
}
