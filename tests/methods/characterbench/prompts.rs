//! The official prompts: the template files are the constants of thu-coai/CharacterBench
//! (their sha256 against the spec's dump and the folder's README), and the rendered role-play
//! and judge prompts of every record equal reference renderings, byte for byte: the spec's
//! own digests of the first record of each shipped file, and the digests Python's
//! `str.format` / `str()` give for every record (tests/fixtures/characterbench/
//! reference_prompts.py, run on the shipped files and on the demo files).

use std::collections::BTreeMap;
use std::path::Path;

use synth::methods::characterbench::{prompts, release};

use super::{bench, demo_release, repo, shared_release};

fn prompt_dir() -> std::path::PathBuf {
    repo().join("pipelines/prompts/characterbench")
}

/// `path -> sha256` of every official template file.
fn file_sums() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for sub in ["roleplay", "judge/zh", "judge/en"] {
        for e in std::fs::read_dir(prompt_dir().join(sub)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "txt") {
                let text = std::fs::read_to_string(&p).unwrap();
                out.insert(format!("{sub}/{}", p.file_name().unwrap().to_string_lossy()), prompts::sha256(&text));
            }
        }
    }
    out
}

#[test]
fn prompt_files_are_the_official_constants_listed_in_the_readme() {
    let sums = file_sums();
    assert_eq!(sums.len(), 2 + 12 * 2, "role-play zh/en + 12 judge templates per language (morality serves MS and MR)");
    let readme = std::fs::read_to_string(prompt_dir().join("README.md")).unwrap();
    let listed: BTreeMap<String, String> = readme
        .lines()
        .filter_map(|l| {
            let (sum, path) = l.trim().split_once("  ")?;
            (sum.len() == 64 && sum.chars().all(|c| c.is_ascii_hexdigit()))
                .then(|| (path.trim().to_string(), sum.to_string()))
        })
        .collect();
    assert_eq!(listed, sums, "README.md lists every template with its sha256");
}

/// The spec's dump (`characterbench_prompts.md`): every block's heading and sha256.
fn spec_sums(spec: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(spec).unwrap();
    let mut out = Vec::new();
    let mut heading = String::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            heading = h.to_string();
        } else if let Some(i) = line.find("sha256=`") {
            out.push((heading.clone(), line[i + 8..i + 8 + 64].to_string()));
        }
    }
    out
}

#[test]
fn prompt_files_match_the_spec_sha256_sums() {
    let spec = repo().join("../shared/specs/characterbench_prompts.md");
    if !spec.exists() {
        eprintln!("SKIPPED: {} is absent", spec.display());
        return;
    }
    let sums = file_sums();
    let mut checked = 0;
    for (heading, sha) in spec_sums(&spec) {
        let file = if let Some(lang) = heading.strip_prefix("`Role_Play_PROMPT_") {
            format!("roleplay/{}.txt", lang.trim_end_matches('`').to_lowercase())
        } else {
            let parts: Vec<&str> = heading.split(" — ").collect();
            if parts.len() != 3 || heading.contains("(guideline)") {
                continue;
            }
            let dim = if parts[0].starts_with("morality_") { "morality" } else { parts[0] };
            format!("judge/{}/{dim}.txt", parts[1])
        };
        assert_eq!(sums.get(&file), Some(&sha), "{file} vs the spec's {heading}");
        checked += 1;
    }
    assert_eq!(checked, 2 + 13 * 2, "every role-play and base_eval_prompt constant of the spec");
}

/// Renders every record of a release directory and compares with a reference table
/// (`dimension id lang prompt chars sha256`).
fn check_renderings(dir: &Path, reference: &str) -> usize {
    let bench = bench();
    let langs = vec!["zh".to_string(), "en".to_string()];
    let table = std::fs::read_to_string(repo().join("tests/fixtures/characterbench").join(reference)).unwrap();
    let mut want: BTreeMap<(String, String, String, String), (usize, String)> = BTreeMap::new();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        want.insert((f[0].into(), f[1].into(), f[2].into(), f[3].into()), (f[4].parse().unwrap(), f[5].into()));
    }
    let mut checked = 0;
    for d in &bench.dimensions {
        let path = dir.join(format!("{}_test.json", d.id));
        if !path.exists() {
            continue;
        }
        let (items, problems) = release::read_file(&path, d, &bench, &langs).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        for item in &items {
            let judge = prompts::judge_item(&bench, item, item.response.as_deref().unwrap()).unwrap();
            let rp = prompts::roleplay(&bench, &item.lang, &item.character_profile, &item.user_profile, &item.messages)
                .unwrap();
            for (kind, text) in [("judge", &judge), ("roleplay", &rp)] {
                let key = (d.id.clone(), item.record_id.clone(), item.lang.clone(), kind.to_string());
                let (chars, sha) = want.get(&key).unwrap_or_else(|| panic!("no reference for {key:?}"));
                assert_eq!((text.chars().count(), prompts::sha256(text)), (*chars, sha.clone()), "{key:?}:\n{text}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, want.len(), "every reference rendering was produced");
    checked
}

#[test]
fn demo_prompts_render_as_pythons_str_format() {
    assert_eq!(check_renderings(&demo_release(), "prompts-demo.sha256.tsv"), 13 * 12 * 2 * 2);
}

#[test]
fn shipped_prompts_render_byte_for_byte() {
    let Some(dir) = shared_release() else { return };
    // 7 files x 150 records x 2 languages x (judge + role-play), dict profiles included.
    assert_eq!(check_renderings(&dir, "prompts.sha256.tsv"), 7 * 150 * 2 * 2);
}

/// The spec's own reference digests (§3.1 and §2.2): the first record of each shipped file.
#[test]
fn the_spec_reference_renderings() {
    let Some(dir) = shared_release() else { return };
    let bench = bench();
    let spec: &[(&str, &str, usize, &str, usize, &str)] = &[
        (
            "memory_consistency",
            "325",
            902,
            "9cb857026aa7120a60f6c472f35445534571a9957f1d4b337100e358ce60357f",
            2454,
            "0f8569ca865281207ee7ce23bb3fe3fbdba734efeca9c3724866c64b89dfa14a",
        ),
        (
            "attribute_consistency_bot",
            "290",
            764,
            "5feaa10c07547e82ed017a95d5dbcea4fbdfbf53ed651cb6cf3d105cd6f83b23",
            2253,
            "69ae86460b4c3431c7b503e8c6cffd29f4c5c56eb7259b3140a2e56d64922fab",
        ),
        (
            "attribute_consistency_human",
            "201",
            1467,
            "0aa8f37c69020d0122198d075e0994e8d1b08aca500a81a1ae647bf0eaaf1d22",
            4707,
            "b19f998c5cbc09f9367f59ecab869ad216a4015d5ec3177aaa75cf1b4644e673",
        ),
        (
            "behavior_consistency_human",
            "237",
            1200,
            "3ae2e98d8b875fbd3e08b09a57956332bffd8445c40ed69a13e3b002bdfcd4fe",
            3787,
            "0ecd523641f3789702861c436e9a96b44ffc4aac7cc4f2a6808312d0fffe8d91",
        ),
        (
            "empathetic_responsiveness",
            "260",
            878,
            "4e9ba9c92c931f9647d8ac004f8ca8dc7c5c5de107338babed71eb66de7a101d",
            3774,
            "6acacdee3ab6ae184f159c7cc94617b0ab9acf0f56fcc491df0b30318d304c91",
        ),
        (
            "engagement",
            "216",
            2141,
            "eba55347170743f857b03804e811622d0121125183c80bc89aa0ce4072d0c3fa",
            6948,
            "aa6d77cf2464f3dbdfca96fa456a6e1e9f50548e5f9c6d492e9d477d918e989e",
        ),
        (
            "human_likeness",
            "237",
            939,
            "c9c296249d172507fec5782e726c0ac82d5d7a3b0d378964239b874a71c9ad92",
            3205,
            "d0b7e12198df04b8e4d3526abc7dccdd6888f34568dfc9439a2fa3a3b2278eca",
        ),
    ];
    let langs = vec!["zh".to_string(), "en".to_string()];
    for (dim, id, zh_chars, zh_sha, en_chars, en_sha) in spec {
        let d = bench.dimension(dim).unwrap();
        let (items, _) = release::read_file(&dir.join(format!("{dim}_test.json")), d, &bench, &langs).unwrap();
        for (lang, chars, sha) in [("zh", zh_chars, zh_sha), ("en", en_chars, en_sha)] {
            let item = items.iter().find(|i| i.record_id == *id && i.lang == lang).unwrap();
            assert_eq!(item.index, 0, "the first record of the file");
            let p = prompts::judge_item(&bench, item, item.response.as_deref().unwrap()).unwrap();
            assert_eq!((p.chars().count(), prompts::sha256(&p).as_str()), (*chars, *sha), "{dim} {id} {lang}");
        }
    }
    // The role-play prompt of memory_consistency id 325: no user_profile key → 无, the greeting
    // after an empty user turn at the top.
    let d = bench.dimension("memory_consistency").unwrap();
    let (items, _) = release::read_file(&dir.join("memory_consistency_test.json"), d, &bench, &langs).unwrap();
    let item = &items[0];
    assert_eq!(item.user_profile, "无");
    assert_eq!(item.messages[0], ("user".to_string(), String::new()));
    assert_eq!(item.messages[1], ("assistant".to_string(), "我纯粹就对金钱比较渴望！".to_string()));
    let rp = prompts::roleplay(&bench, "zh", &item.character_profile, &item.user_profile, &item.messages).unwrap();
    assert_eq!(
        (rp.chars().count(), prompts::sha256(&rp).as_str()),
        (1967, "d029fe8571bf50ec82d6f922323c21c0cac084d5d96cb936d756d227322ef07c")
    );
    // The zh memory prompt's empty [多轮对话] block and the duplicated name of the reference line.
    let judge = prompts::judge_item(&bench, item, item.response.as_deref().unwrap()).unwrap();
    assert!(judge.contains("[多轮对话]\n\n\n[用户发言]\n用户：阿耀哥，你每天穿过沿海公路做什么活动啊？\n\n[角色回复]\n吴仁耀：其实没什么活动，就是在路上练车。"), "{judge}");
    assert!(judge.ends_with("[参考对话历史]\n吴仁耀：吴仁耀：我呢，一直生活在这个小岛，没什么朋友。我只有一辆摩托车，所以它是我的朋友。我给它改了很多东西，用它练飞坡和特技。我每天都会开着它穿过沿海公路到码头做表演。\n\n"));
}
