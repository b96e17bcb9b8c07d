//! RoleMRC parser fixtures: every `tests/fixtures/rolemrc/{profiles,dialogues,stylized}/NAME.txt`
//! is parsed with its parser and compared with `NAME.expected` (the parsed row as pretty
//! JSON, or `ERROR: <message>`). `NAME.record.json` is the input record (default `{}`);
//! `NAME.options.json` the parser options (default: see `SUITES`). Answers go through
//! `Parser::accept` (what the `llm` stage calls), so a parser's own checks are covered. Names starting `ok_`
//! must parse and `err_` must be rejected, whatever the expectation says. Set
//! UPDATE_EXPECT=1 to rewrite the expectations after an intended change (then review the diff).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use synth::data::Row;
use synth::methods::rolemrc::parsers::{parse_profile, split_narration};

/// (fixture folder, parser, default parser options).
const SUITES: [(&str, &str, &str); 3] = [
    ("profiles", "profile", "null"),
    ("dialogues", "dialogue", r#"{"first_column": "first", "narration_column": "narration"}"#),
    ("stylized", "stylized", r#"{"narration_column": "narration"}"#),
];

fn dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rolemrc").join(sub)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn read_json(p: &Path) -> Option<Value> {
    p.exists().then(|| serde_json::from_str(&read(p)).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

/// The fixture inputs of a folder, sorted; fails on files that belong to no input.
fn cases(sub: &str) -> Vec<PathBuf> {
    let mut inputs = Vec::new();
    let mut others = Vec::new();
    for e in std::fs::read_dir(dir(sub)).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "txt") { inputs.push(p) } else { others.push(p) }
    }
    for p in others {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let stem = [".expected", ".record.json", ".options.json"].iter().find_map(|s| name.strip_suffix(s));
        let stem = stem.unwrap_or_else(|| panic!("{}: not a fixture file", p.display()));
        assert!(dir(sub).join(format!("{stem}.txt")).exists(), "{}: no {stem}.txt beside it", p.display());
    }
    inputs.sort();
    assert!(inputs.len() >= 5, "too few fixtures in {sub}");
    inputs
}

fn sibling(case: &Path, suffix: &str) -> PathBuf {
    let stem = case.file_stem().unwrap().to_string_lossy();
    case.with_file_name(format!("{stem}{suffix}"))
}

/// Parse one fixture: its result, and the text an expectation file holds for it.
fn run_case(parser: &str, default_options: &str, case: &Path) -> (Result<Row, String>, String) {
    let options = read_json(&sibling(case, ".options.json"))
        .unwrap_or_else(|| serde_json::from_str(default_options).expect("default options"));
    let record = match read_json(&sibling(case, ".record.json")) {
        Some(Value::Object(m)) => m,
        None => Row::new(),
        Some(other) => panic!("{}: the record must be an object, found {other}", case.display()),
    };
    let p =
        synth::registry::builtin().build_parser(parser, &options).unwrap_or_else(|e| panic!("{}: {e}", case.display()));
    // What the llm stage calls: parse, then the parser's own checks (a rejection of
    // another kind than `validation` shows its kind).
    let result = p.accept(&read(case), &record).map_err(|r| match r.kind {
        synth::store::failures::FailureKind::Validation => r.reason,
        kind => format!("({kind}) {}", r.reason),
    });
    let shown = match &result {
        Ok(row) => format!("{}\n", serde_json::to_string_pretty(row).unwrap()),
        Err(e) => format!("ERROR: {e}\n"),
    };
    (result, shown)
}

/// A line-by-line comparison that marks the first differing line.
fn diff(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let first = (0..e.len().max(a.len())).find(|&i| e.get(i) != a.get(i)).unwrap_or(0);
    let mut out = format!("first difference at line {}\n", first + 1);
    for i in first.saturating_sub(2)..(first + 3).min(e.len().max(a.len())) {
        if e.get(i) == a.get(i) {
            out.push_str(&format!("   {}\n", e[i]));
        } else {
            if let Some(l) = e.get(i) {
                out.push_str(&format!(" - {l}\n"));
            }
            if let Some(l) = a.get(i) {
                out.push_str(&format!(" + {l}\n"));
            }
        }
    }
    out
}

fn check_suite(sub: &str, parser: &str, default_options: &str) {
    let update = std::env::var_os("UPDATE_EXPECT").is_some();
    let mut failures = Vec::new();
    for case in cases(sub) {
        let name = case.file_stem().unwrap().to_string_lossy().to_string();
        let (result, shown) = run_case(parser, default_options, &case);
        match (name.starts_with("ok_"), name.starts_with("err_"), &result) {
            (true, _, Err(e)) => failures.push(format!("{}: expected to parse, got: {e}", case.display())),
            (_, true, Ok(_)) => failures.push(format!("{}: expected a rejection, but it parsed", case.display())),
            (false, false, _) => failures.push(format!("{}: name must start with ok_ or err_", case.display())),
            _ => {}
        }
        let expected_path = sibling(&case, ".expected");
        if update {
            std::fs::write(&expected_path, &shown).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("missing {} (run with UPDATE_EXPECT=1)", expected_path.display()));
        if shown != expected {
            failures.push(format!(
                "{}: output differs from {}\n{}--- expected\n{expected}--- actual\n{shown}",
                case.display(),
                expected_path.display(),
                diff(&expected, &shown)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn profile_fixtures() {
    let (sub, parser, opts) = SUITES[0];
    check_suite(sub, parser, opts);
}

#[test]
fn dialogue_fixtures() {
    let (sub, parser, opts) = SUITES[1];
    check_suite(sub, parser, opts);
}

#[test]
fn stylized_fixtures() {
    let (sub, parser, opts) = SUITES[2];
    check_suite(sub, parser, opts);
}

// ------------------------------------------------ hand-written checks, independent of .expected

fn profile_fixture(name: &str) -> Result<synth::methods::rolemrc::parsers::Profile, String> {
    parse_profile(&read(&dir("profiles").join(format!("{name}.txt"))), 1)
}

#[test]
fn thorin_lands_in_the_right_fields() {
    let p = profile_fixture("ok_thorin_paper").unwrap();
    assert_eq!(p.role_name, "Thorin Ironfoot");
    assert_eq!(p.identification, "Thorin Ironfoot, the Creative Dwarf");
    assert!(p.description.starts_with("Thorin Ironfoot is a resourceful") && p.description.ends_with("loves dancing!"));
    let names = |l: &[(String, String)]| l.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&p.skills), ["Creative Thinking", "Practical Solutions", "Versatile Knowledge"]);
    assert!(p.skills[0].1.starts_with("Thorin excels"));
    assert_eq!(names(&p.personality), ["Inventive", "Encouraging", "Practical", "Friendly"]);
    assert_eq!(p.experience.len(), 3);
    assert!(p.experience[1].starts_with("Thorin Ironfoot loves dancing."));
    assert!(p.speech_style.starts_with("Thorin speaks in a hearty") && p.speech_style.contains("\"we\""));
    assert!(p.boundaries.starts_with("While Thorin is highly creative"));
    let topics: Vec<&str> = p.speech_examples.iter().map(|(t, _, _)| t.as_str()).collect();
    assert_eq!(topics, ["Yard Design", "Indoor Activity", "Related Activity", "Dancing"]);
    let (_, narration, content) = &p.speech_examples[0];
    assert_eq!(narration, "With a twinkle in his eye and an animated wave of his hands");
    assert!(content.starts_with("We could transform") && content.ends_with("whole family!"), "{content}");
}

#[test]
fn evan_lands_in_the_right_fields() {
    let p = profile_fixture("ok_evan_figure7").unwrap();
    assert_eq!(p.role_name, "Evan Brightcode");
    assert_eq!(p.identification, "Evan Brightcode, the Front-End Prodigy.");
    assert!(p.description.starts_with("Evan Brightcode is a talented"), "{}", p.description);
    assert_eq!(p.skills.len(), 5);
    assert_eq!(p.skills[3].0, "Cross-Browser Compatibility");
    assert_eq!(p.personality.len(), 5);
    assert_eq!(p.personality[4].0, "Detail-Oriented");
    assert_eq!(p.experience.len(), 4);
    assert_eq!(p.speech_examples.len(), 5);
    let (topic, narration, content) = &p.speech_examples[4];
    assert_eq!(topic, "Mentoring Session");
    assert_eq!(narration, "Evan leans back, his tone encouraging");
    assert!(content.starts_with("Don’t worry"));
}

#[test]
fn markdown_variants_match_the_plain_format() {
    for name in ["ok_markdown_headings", "ok_numbered_headings", "ok_plain_numbered_headings", "ok_chatter_around"] {
        let p = profile_fixture(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.role_name, "Thorin Ironfoot", "{name}");
        assert_eq!(p.identification, "Thorin Ironfoot, the Creative Dwarf", "{name}");
        assert!(p.description.starts_with("Thorin Ironfoot is a resourceful"), "{name}: {}", p.description);
        for (n, d) in p.skills.iter().chain(&p.personality) {
            assert!(!n.is_empty() && !d.is_empty() && !n.contains('*') && !d.contains('*'), "{name}: {n:?} {d:?}");
        }
        for e in &p.experience {
            assert!(e.starts_with("Thorin") || e.starts_with("He "), "{name}: {e:?}");
        }
        for (t, n, c) in &p.speech_examples {
            assert!(!t.is_empty() && !t.contains('*'), "{name}: topic {t:?}");
            assert!(!n.is_empty() && !n.contains('(') && !n.contains(')'), "{name}: narration {n:?}");
            assert!(!c.starts_with('"') && !c.ends_with('"') && !c.contains('`'), "{name}: content {c:?}");
        }
        assert!(p.boundaries.ends_with('.') && !p.boundaries.contains("---"), "{name}: {}", p.boundaries);
    }
}

#[test]
fn chatter_is_not_a_speech_example() {
    for name in ["ok_chatter_around", "ok_chatter_after_unfenced"] {
        let p = profile_fixture(name).unwrap();
        let topics: Vec<&str> = p.speech_examples.iter().map(|(t, _, _)| t.as_str()).collect();
        assert_eq!(topics, ["Yard Design", "Dancing"], "{name}");
    }
}

#[test]
fn examples_without_narration_keep_their_words() {
    let p = profile_fixture("ok_examples_without_narration").unwrap();
    let got: Vec<(&str, &str, &str)> =
        p.speech_examples.iter().map(|(t, n, c)| (t.as_str(), n.as_str(), c.as_str())).collect();
    assert_eq!(
        got,
        [
            ("Greeting", "", "Well met, friend! What shall we build today?"),
            ("Candles", "", "We could try our hand at making homemade candles: different scents, different colors!"),
            ("Dancing", "", "How about a dance-off challenge?"),
        ]
    );
}

#[test]
fn rendered_profiles_parse_back_to_the_same_profile() {
    for case in cases("profiles") {
        let Ok(p) = parse_profile(&read(&case), 1) else { continue };
        let again = parse_profile(&p.render(true), 1).unwrap_or_else(|e| panic!("{}: {e}", case.display()));
        assert_eq!(again, p, "{}", case.display());
        let bare = parse_profile(&p.render(false), 1).unwrap();
        assert!(bare.speech_examples.iter().all(|(_, n, _)| n.is_empty()), "{}", case.display());
        let contents = |p: &synth::methods::rolemrc::parsers::Profile| {
            p.speech_examples.iter().map(|(_, _, c)| c.clone()).collect::<Vec<_>>()
        };
        assert_eq!(contents(&bare), contents(&p), "{}", case.display());
    }
}

#[test]
fn rejections_name_what_is_missing() {
    let e = profile_fixture("err_missing_boundaries").unwrap_err();
    assert!(e.contains("Ability and Knowledge Boundaries"), "{e}");
    for other in ["Speech Style", "Speech Examples", "Personality", "Specific Abilities"] {
        assert!(!e.contains(&format!(": {other}")) && !e.contains(&format!(", {other}")), "{e}");
    }
    let e = profile_fixture("err_missing_two_sections").unwrap_err();
    assert!(e.contains("Speech Style, Personality Characteristics"), "{e}");
    assert!(profile_fixture("err_no_speech_examples").unwrap_err().contains("at least 1 speech example"));
    assert!(profile_fixture("err_empty_speech_examples").unwrap_err().contains("Speech Examples"));
    let e = profile_fixture("err_garbled").unwrap_err();
    assert!(e.contains("Role Name and Brief Description") && e.contains("Speech Examples"), "{e}");
}

// ------------------------------------------------------------------------ dialogues

fn dialogue(name: &str) -> (Result<Row, String>, String) {
    let (_, parser, opts) = SUITES[1];
    run_case(parser, opts, &dir("dialogues").join(format!("{name}.txt")))
}

fn assistant_turns(row: &Row) -> Vec<String> {
    row["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "Assistant")
        .map(|t| t["content"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn dialogue_turns_and_narration() {
    let kept = dialogue("ok_user_first_12").0.unwrap();
    assert_eq!(kept["n_turns"], 12);
    assert_eq!(kept["first_speaker"], "user");
    let roles: Vec<&str> = kept["turns"].as_array().unwrap().iter().map(|t| t["role"].as_str().unwrap()).collect();
    assert!(roles.chunks(2).all(|c| c == ["User", "Assistant"]), "{roles:?}");
    let kept = assistant_turns(&kept);
    assert_eq!(kept.iter().filter(|c| c.starts_with('(')).count(), 3);

    let stripped = assistant_turns(&dialogue("ok_narration_stripped").0.unwrap());
    assert_eq!(stripped.len(), kept.len());
    for (k, s) in kept.iter().zip(&stripped) {
        assert!(!s.starts_with('('), "{s}");
        assert_eq!(s, &split_narration(k).1);
    }

    let role_first = dialogue("ok_role_first_fenced").0.unwrap();
    assert_eq!(role_first["first_speaker"], "role");
    assert_eq!(role_first["n_turns"], 11);
    let wrapped = &assistant_turns(&role_first)[2];
    assert!(wrapped.ends_with("herb world.\nThis one is wrapped onto a second line by the model."), "{wrapped}");
}

#[test]
fn dialogue_rejections_say_why() {
    let err = |name: &str| dialogue(name).0.unwrap_err();
    assert!(err("err_not_alternating").contains("User speaks twice in a row"));
    assert!(err("err_wrong_speaker").contains("\"Role Name\" is neither User nor Thorin Ironfoot"));
    assert!(err("err_too_short_9").contains("has 9 turns"));
    assert!(err("err_too_long_16").contains("has 16 turns"));
    assert!(err("err_first_column_mismatch").contains("must start with Thorin Ironfoot"));
    assert!(err("err_bad_first_column").contains("column \"first\""));
    assert!(err("err_bad_narration_column").contains("column \"narration\""));
    assert!(err("err_no_role_name").contains("column \"role_name\""));
}

#[test]
fn record_columns_override_static_options() {
    let text = read(&dir("dialogues").join("ok_user_first_12.txt"));
    let record = |v: Value| v.as_object().unwrap().clone();
    let opts = json!({"first": "role", "narration": "reject", "first_column": "who", "narration_column": "narr"});
    let p = synth::registry::builtin().build_parser("dialogue", &opts).unwrap();
    // The static options alone reject this user-first dialogue with narration...
    assert!(p.parse(&text, &record(json!({"role_name": "Thorin Ironfoot"}))).is_err());
    assert!(p.parse(&text, &record(json!({"role_name": "Thorin Ironfoot", "who": "user"}))).is_err());
    // ...the record's columns allow it.
    let ok = p.parse(&text, &record(json!({"role_name": "Thorin Ironfoot", "who": "user", "narr": true}))).unwrap();
    assert_eq!(assistant_turns(&ok).iter().filter(|c| c.starts_with('(')).count(), 3);
    let ok = p.parse(&text, &record(json!({"role_name": "Thorin Ironfoot", "who": "any", "narr": false}))).unwrap();
    assert!(assistant_turns(&ok).iter().all(|c| !c.starts_with('(')));
    // Without the column options, the record's columns are ignored.
    let plain = synth::registry::builtin().build_parser("dialogue", &json!({"first": "role"})).unwrap();
    assert!(plain.parse(&text, &record(json!({"role_name": "Thorin Ironfoot", "first": "user"}))).is_err());

    let s = synth::registry::builtin()
        .build_parser("stylized", &json!({"narration": "required", "narration_column": "n"}))
        .unwrap();
    assert!(s.parse("Paris.", &record(json!({"n": null}))).is_err());
    assert_eq!(s.parse("Paris.", &record(json!({"n": true}))).unwrap()["reply"], "Paris.");
    let row = s.parse("(He grins) Paris.", &record(json!({"n": false}))).unwrap();
    assert_eq!((row["reply"].as_str(), row["narration"].is_null()), (Some("Paris."), true));
}

#[test]
fn stylized_cleanup() {
    let (_, parser, opts) = SUITES[2];
    let row = |name: &str| run_case(parser, opts, &dir("stylized").join(format!("{name}.txt"))).0.unwrap();
    let r = row("ok_with_narration");
    assert_eq!(r["narration"], "Thorin strokes his braided beard and grins");
    assert_eq!(r["content"], "The capital of France is Paris, my friend!");
    assert!(r["reply"].as_str().unwrap().starts_with("(Thorin strokes"));
    let r = row("ok_column_false_strips");
    assert_eq!(r["reply"], "The capital of France is Paris, my friend!");
    assert!(r["narration"].is_null());
    for name in ["ok_fence_and_label", "ok_fence_language_tag"] {
        let r = row(name);
        let reply = r["reply"].as_str().unwrap();
        assert!(reply.starts_with("(Thorin ") && !reply.contains('`') && !reply.contains("Edited"), "{name}: {reply}");
        assert!(r["content"].as_str().unwrap().starts_with("Paris, of course!"), "{name}");
    }
}

#[test]
fn synth_list_shows_the_column_options() {
    let names =
        |k: &str| synth::registry::builtin().parser(k).unwrap().options.iter().map(|o| o.name).collect::<Vec<_>>();
    let d = names("dialogue");
    assert!(d.contains(&"first_column") && d.contains(&"narration_column"), "{d:?}");
    assert!(names("stylized").contains(&"narration_column"));
    for k in ["dialogue", "stylized"] {
        for o in synth::registry::builtin().parser(k).unwrap().options {
            assert!(!o.doc.is_empty(), "{k}.{}", o.name);
        }
    }
}

/// The structured answer carrying the content of a parsed text answer, in each parser's
/// JSON layout (`pipelines/prompts/rolemrc/*.schema.json`).
fn structured_of(parser: &str, row: &Row) -> Value {
    match parser {
        "profile" => {
            // (JSON key, the row's column)
            let keys = [
                ("role_name", "identification"),
                ("brief_description", "description"),
                ("specific_abilities_and_skills", "skills"),
                ("speech_style", "speech_style"),
                ("personality_characteristics", "personality"),
                ("past_experience_and_background", "experience"),
                ("ability_and_knowledge_boundaries", "boundaries"),
            ];
            let mut obj: serde_json::Map<String, Value> =
                keys.iter().map(|(k, c)| (k.to_string(), row[*c].clone())).collect();
            let examples: Vec<Value> = row["speech_examples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| json!({"topic": e["topic"], "narration": e["narration"], "speech": e["content"]}))
                .collect();
            obj.insert("speech_examples".into(), Value::Array(examples));
            Value::Object(obj)
        }
        "dialogue" => {
            let turns: Vec<Value> = row["turns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let speaker = if t["role"] == "User" { "user" } else { "role" };
                    json!({"speaker": speaker, "content": t["content"]})
                })
                .collect();
            json!({ "turns": turns })
        }
        _ => json!({"narration": row["narration"].as_str().unwrap_or(""), "answer": row["content"]}),
    }
}

/// A JSON answer gives the columns the text parser gives for the same content: every `ok_`
/// fixture's parsed content, as its parser's structured layout, parses to the same row (for
/// stylized answers: the row of the canonical text `(narration) answer`, since the text
/// protocol keeps the reply as written, quotes and all).
#[test]
fn structured_answers_give_the_text_parsers_columns() {
    let mut checked = 0;
    for (sub, parser, default_options) in SUITES {
        for case in cases(sub) {
            if !case.file_stem().unwrap().to_string_lossy().starts_with("ok_") {
                continue;
            }
            let options = read_json(&sibling(&case, ".options.json"))
                .unwrap_or_else(|| serde_json::from_str(default_options).expect("default options"));
            let record = match read_json(&sibling(&case, ".record.json")) {
                Some(Value::Object(m)) => m,
                _ => Row::new(),
            };
            let p = synth::registry::builtin().build_parser(parser, &options).unwrap();
            let text_row = p.accept(&read(&case), &record).unwrap();
            let answer = structured_of(parser, &text_row);
            let json_row = p
                .accept_json(answer.as_object().unwrap(), &record)
                .unwrap_or_else(|e| panic!("{}: {answer}: {}", case.display(), e.reason));
            let expected = if parser == "stylized" {
                let canonical = match text_row["narration"].as_str() {
                    Some(n) => format!("({n}) {}", text_row["content"].as_str().unwrap()),
                    None => text_row["content"].as_str().unwrap().to_string(),
                };
                let row = p.accept(&canonical, &record).unwrap();
                assert_eq!(row["content"], text_row["content"], "{}", case.display());
                row
            } else {
                text_row
            };
            assert_eq!(json_row, expected, "{}", case.display());
            checked += 1;
        }
    }
    assert!(checked >= 10, "{checked}");
}

/// A structured answer breaking a parser's rules is rejected like the text would be.
#[test]
fn structured_answers_are_checked_like_text() {
    let p = synth::registry::builtin().build_parser("dialogue", &json!({"min_turns": 2, "max_turns": 4})).unwrap();
    let record = Row::from_iter([("role_name".to_string(), json!("Thorin"))]);
    let twice = json!({"turns": [{"speaker": "user", "content": "hi"}, {"speaker": "user", "content": "again"}]});
    let e = p.accept_json(twice.as_object().unwrap(), &record).unwrap_err();
    assert!(e.reason.contains("twice in a row"), "{}", e.reason);
    let named = json!({"turns": [{"speaker": "User", "content": "hi"}, {"speaker": "Thorin", "content": "hello"}]});
    assert_eq!(p.accept_json(named.as_object().unwrap(), &record).unwrap()["n_turns"], 2);
    let stranger = json!({"turns": [{"speaker": "user", "content": "hi"}, {"speaker": "Gimli", "content": "hello"}]});
    assert!(p.accept_json(stranger.as_object().unwrap(), &record).unwrap_err().reason.contains("Gimli"));
    // The degenerate-pair check holds for structured answers too (its own failure kind).
    let s = synth::registry::builtin().build_parser("stylized", &json!({"differ_from": "answer"})).unwrap();
    let rec = Row::from_iter([("answer".to_string(), json!("The tower is  50 m tall."))]);
    let same = json!({"narration": "", "answer": "The tower is 50 m tall."});
    let e = s.accept_json(same.as_object().unwrap(), &rec).unwrap_err();
    assert_eq!(e.kind, synth::store::failures::FailureKind::DegeneratePair);
    // A profile section left empty is missing, as in text.
    let prof = synth::registry::builtin().build_parser("profile", &Value::Null).unwrap();
    let mut obj = structured_of(
        "profile",
        &prof.accept(&read(&dir("profiles").join(format!("{}.txt", first_ok("profiles")))), &Row::new()).unwrap(),
    );
    obj["specific_abilities_and_skills"] = json!([]);
    let e = prof.accept_json(obj.as_object().unwrap(), &Row::new()).unwrap_err();
    assert!(e.reason.contains("Specific Abilities and Skills"), "{}", e.reason);
}

fn first_ok(sub: &str) -> String {
    cases(sub)
        .iter()
        .map(|c| c.file_stem().unwrap().to_string_lossy().to_string())
        .find(|n| n.starts_with("ok_"))
        .unwrap()
}
