//! Architecture invariants checked by `cargo test` (rust-analyzer's tidy tests): the
//! layer map of ARCHITECTURE.md, "the engine never names a method", kind names, and
//! who commits files. Each walks `src/` anew, so a new file that breaks a rule fails
//! here without anyone listing it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layers, lowest first: a unit may use units of its own layer or below, and
/// only those listed in [`ALLOWED`]. A unit is a top-level module of `src/`, except
/// that `stages/mod.rs` + `stages/exec.rs` (the stage API, L3) are apart from the
/// generic kinds in `stages/*.rs` (L4).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "L0 leaves",
        &[
            "data",
            "rng",
            "secrets",
            "template",
            "progress",
            "config",
            "store",
            "eval",
            "retrieval",
            "onnx",
            "hub",
            "fetch",
            "quality",
        ],
    ),
    ("L1 capabilities", &["llm", "embed"]),
    ("L2 run services", &["services"]),
    ("L3 stage API", &["stages::api"]),
    ("L4 kinds", &["stages::kinds", "methods"]),
    ("L5 compile and run", &["pipeline", "dag", "registry", "regen"]),
    ("L6 front ends", &["cli", "bench", "view", "lib", "main"]),
];

/// What each unit may import (`crate::<unit>`), besides itself.
const ALLOWED: &[(&str, &[&str])] = &[
    ("data", &[]),
    ("rng", &[]),
    ("secrets", &[]),
    ("template", &["data"]),
    ("progress", &[]),
    ("config", &[]),
    ("store", &["data", "secrets"]),
    ("eval", &["onnx"]),
    ("retrieval", &[]),
    ("onnx", &[]),
    ("hub", &[]),
    ("fetch", &["store"]),
    ("quality", &["data", "config", "template"]),
    ("llm", &["config", "data", "progress", "secrets", "store", "hub"]),
    ("embed", &["llm", "config", "store", "secrets", "onnx", "retrieval"]),
    ("services", &["llm", "embed", "store", "config", "progress", "secrets"]),
    (
        "stages::api",
        &[
            "services", "llm", "config", "data", "progress", "secrets", "store", "rng", "template", "hub", "fetch",
            "quality",
        ],
    ),
    (
        "stages::kinds",
        &[
            "stages::api",
            "services",
            "llm",
            "embed",
            "eval",
            "retrieval",
            "store",
            "data",
            "template",
            "config",
            "hub",
            "rng",
            "progress",
            "secrets",
            "onnx",
            "quality",
        ],
    ),
    (
        "methods",
        &[
            "stages::api",
            "stages::kinds",
            "services",
            "llm",
            "eval",
            "store",
            "data",
            "template",
            "config",
            "rng",
            "secrets",
            "hub",
            "quality",
        ],
    ),
    ("pipeline", &["config", "dag", "registry", "stages::api", "llm", "embed", "data", "template"]),
    (
        "dag",
        &["pipeline", "stages::api", "services", "store", "config", "progress", "secrets", "llm", "data", "quality"],
    ),
    ("registry", &["stages::api", "stages::kinds", "methods", "llm"]),
    ("regen", &["dag", "pipeline", "stages::api", "progress", "store", "config", "secrets", "hub", "data", "llm"]),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The unit a file belongs to (its path relative to `src/`).
fn unit_of(rel: &str) -> String {
    let first = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
    if first == "stages" {
        return if rel == "stages/mod.rs" || rel == "stages/exec.rs" { "stages::api" } else { "stages::kinds" }.into();
    }
    first
}

/// The unit a `crate::` path names (`crate::stages::exec::x` → the API; `crate::stages::llm` → a kind).
fn unit_of_path(path: &str) -> String {
    let mut parts = path.split("::");
    let first = parts.next().unwrap_or_default();
    if first == "stages" {
        return match parts.next() {
            Some("exec") | None => "stages::api".into(),
            Some(next) if next.starts_with(|c: char| c.is_uppercase()) || next.starts_with('{') => "stages::api".into(),
            Some(next) if is_kind_module(next) => "stages::kinds".into(),
            Some(_) => "stages::api".into(),
        };
    }
    first.to_string()
}

fn is_kind_module(name: &str) -> bool {
    src().join("stages").join(format!("{name}.rs")).exists() && name != "exec" && name != "mod"
}

/// Code before `#[cfg(test)]` with comments removed (tests may reach anywhere).
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// Every `crate::a::b` path in the code, as `a::b` (nested `use crate::{a, b}` groups too).
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while let Some(pos) = code[i..].find("crate::") {
        let start = i + pos + "crate::".len();
        // `super::crate` does not exist; skip identifiers that merely end in "crate".
        let before = code[..i + pos].chars().next_back();
        i = start;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if bytes.get(start) == Some(&b'{') {
            let end = code[start..].find('}').map(|e| start + e).unwrap_or(code.len());
            for item in code[start + 1..end].split(',') {
                let item = item.trim();
                if !item.is_empty() {
                    out.push(item.split(['{', ' ']).next().unwrap_or_default().trim_end_matches("::").to_string());
                }
            }
            continue;
        }
        let end = code[start..]
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map(|e| start + e)
            .unwrap_or(code.len());
        out.push(code[start..end].trim_end_matches(':').to_string());
    }
    out
}

fn layer(unit: &str) -> usize {
    LAYERS
        .iter()
        .position(|(_, units)| units.contains(&unit))
        .unwrap_or_else(|| panic!("unit \"{unit}\" is in no layer: add it to LAYERS (and ARCHITECTURE.md)"))
}

/// Violations of the layer map in `src/`: `file: uses crate::x (unit) ...`.
fn layer_violations(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    crate::support::rust_files(root, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
        let unit = unit_of(&rel);
        let from = layer(&unit);
        let allowed: &[&str] = ALLOWED.iter().find(|(u, _)| *u == unit).map(|(_, a)| *a).unwrap_or(&[]);
        let front_end = from == LAYERS.len() - 1;
        let text = std::fs::read_to_string(&f).unwrap();
        let mut seen = BTreeSet::new();
        for path in crate_paths(&code(&text)) {
            let target = unit_of_path(&path);
            if target == unit || !seen.insert(target.clone()) {
                continue;
            }
            let to = layer(&target);
            if to > from {
                bad.push(format!(
                    "src/{rel} ({unit}, {}) uses crate::{path} ({target}, {}): a layer above",
                    LAYERS[from].0, LAYERS[to].0
                ));
            } else if !front_end && !allowed.contains(&target.as_str()) {
                bad.push(format!("src/{rel} ({unit}) uses crate::{path} ({target}), which is not in its ALLOWED list"));
            }
        }
    }
    bad
}

#[test]
fn allowed_lists_respect_the_layers() {
    for (unit, deps) in ALLOWED {
        for d in *deps {
            assert!(layer(d) <= layer(unit), "ALLOWED lets {unit} ({}) use {d} ({})", layer(unit), layer(d));
        }
    }
}

#[test]
fn layers() {
    let bad = layer_violations(&src());
    assert!(bad.is_empty(), "imports against the layer map (ARCHITECTURE.md, \"Layers\"):\n{}", bad.join("\n"));
}

#[test]
fn a_new_file_that_breaks_the_layers_is_caught() {
    // A copy of src/ with one more file in llm/ that imports a method must fail.
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&src(), tmp.path());
    std::fs::write(
        tmp.path().join("llm/shortcut.rs"),
        "//! A shortcut.\nuse crate::methods::METHODS;\npub fn n() -> usize { METHODS.len() }\n",
    )
    .unwrap();
    let bad = layer_violations(tmp.path());
    assert!(bad.iter().any(|b| b.contains("src/llm/shortcut.rs")), "{bad:?}");
    assert!(!method_mentions(tmp.path()).is_empty(), "the engine-names-no-method rule missed llm/shortcut.rs");
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

/// The methods: the folders of `src/methods/`.
fn methods() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(src().join("methods"))
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            p.is_dir().then(|| p.file_name().unwrap().to_string_lossy().to_string())
        })
        .collect();
    out.sort();
    out
}

/// Files outside `src/methods/` that import the methods module or name a method.
fn method_mentions(root: &Path) -> Vec<String> {
    let names = methods();
    let mut files = Vec::new();
    crate::support::rust_files(root, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
        if rel.starts_with("methods/") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        // The registry reads the method list; lib.rs declares the module.
        let may_import = rel == "registry.rs" || rel == "lib.rs";
        let via_super = code(&text).contains("super::methods") || code(&text).contains("methods::METHODS");
        if !may_import
            && (via_super || crate_paths(&code(&text)).iter().any(|p| p == "methods" || p.starts_with("methods::")))
        {
            bad.push(format!("src/{rel} imports crate::methods (only the registry may)"));
        }
        let lower = text.to_lowercase();
        for n in &names {
            if lower.contains(n.as_str()) {
                bad.push(format!("src/{rel} names the method \"{n}\""));
            }
        }
    }
    bad
}

#[test]
fn engine_never_names_a_method() {
    assert!(methods().contains(&"rolemrc".to_string()));
    let bad = method_mentions(&src());
    assert!(bad.is_empty(), "engine code that knows a method:\n{}", bad.join("\n"));
}

#[test]
fn kind_names_follow_their_files() {
    // An engine kind is named by its file stem; a method kind `<method>_<file stem>`.
    let exceptions = [("methods/rolemrc/stages/chat_format.rs", "chat_format")];
    let mut files = Vec::new();
    crate::support::rust_files(&src(), &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(src()).unwrap().to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(&f).unwrap();
        let Some(i) = text.find(": KindInfo = KindInfo {") else { continue };
        let name = text[i..].split("name: \"").nth(1).and_then(|s| s.split('"').next()).unwrap_or_default();
        let stem = f.file_stem().unwrap().to_string_lossy().to_string();
        let expected = match rel.strip_prefix("methods/") {
            Some(rest) => format!("{}_{stem}", rest.split('/').next().unwrap()),
            None => stem,
        };
        if name != expected && !exceptions.contains(&(rel.as_str(), name)) {
            bad.push(format!("src/{rel}: kind \"{name}\", expected \"{expected}\""));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn only_the_runner_commits() {
    // Stages hand temporary files to the engine; a stage that runs an external program
    // (`train`, `neurons`) commits that program's input files into the stage working
    // directory through `stages/external.rs` (ARCHITECTURE.md).
    let mut files = Vec::new();
    crate::support::rust_files(&src(), &mut files);
    // `regen/` commits its own files (snapshots, row indexes), never a stage's.
    let allowed = |rel: &str| {
        rel.starts_with("dag/")
            || rel.starts_with("store/")
            || rel.starts_with("cli/")
            || rel.starts_with("regen/")
            || rel == "stages/external.rs"
    };
    let bad: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(src()).unwrap().to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(f).unwrap();
            (!allowed(&rel) && code(&text).contains(".commit()")).then(|| format!("src/{rel}"))
        })
        .collect();
    assert!(bad.is_empty(), "files that commit outputs outside the runner: {bad:?}");
}

#[test]
fn every_failure_kind_is_documented_in_the_user_guide() {
    let page = "docs/operations/caching.md";
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(page)).unwrap();
    for k in synth::store::failures::FailureKind::ALL {
        assert!(text.contains(&format!("`{}`", k.as_str())), "{page} does not list the failure kind `{k}`");
    }
}

/// `page` is what `synth ARGS` prints (with UPDATE_EXPECT=1: made so); the generated text
/// must hold each of `probes`.
fn assert_page_is_generated(page: &str, args: &[&str], probes: &[&str]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(page);
    let out = std::process::Command::new(crate::support::synth_bin()).args(args).output().unwrap();
    assert!(out.status.success(), "synth {}", args.join(" "));
    let generated = String::from_utf8(out.stdout).unwrap();
    for p in probes {
        assert!(generated.contains(p), "synth {} does not print {p:?}", args.join(" "));
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    if std::env::var_os("UPDATE_EXPECT").is_some() && written != generated {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    assert!(written == generated, "{page} is stale: run `synth {} > {page}` (or UPDATE_EXPECT=1)", args.join(" "));
}

/// docs/reference.md is `synth list --markdown`: a kind, option or default changed in the
/// registry and not in the page fails here.
#[test]
fn the_pipeline_reference_is_generated_from_the_registry() {
    assert_page_is_generated("docs/reference.md", &["list", "--markdown"], &["### `llm`"]);
}

/// docs/cli.md is `synth list --cli`: a command, argument, default or conflict changed in
/// the command-line definitions and not on the page fails here.
#[test]
fn the_command_line_reference_is_generated_from_the_definitions() {
    assert_page_is_generated("docs/cli.md", &["list", "--cli"], &["\n## synth run\n", "--dry-run"]);
}

/// Every relative link of the README and the user guide points at a file that exists.
#[test]
fn the_readme_and_the_user_guide_link_to_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    let mut stack = vec![root.join("docs")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "md") {
                pages.push(path);
            }
        }
    }
    assert!(pages.len() > 5, "the user guide is missing: {pages:?}");
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (i, _) in text.match_indices("](") {
            let target: String = text[i + 2..].chars().take_while(|c| *c != ')').collect();
            let file = target.split('#').next().unwrap_or_default();
            if file.is_empty() || file.contains("://") {
                continue;
            }
            if !page.parent().unwrap().join(file).exists() {
                broken.push(format!("{}: {target}", page.strip_prefix(root).unwrap().display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:?}");
}

#[test]
fn every_module_says_its_job() {
    let mut files = Vec::new();
    crate::support::rust_files(&src(), &mut files);
    let bad: Vec<String> = files
        .iter()
        .filter(|f| !std::fs::read_to_string(f).unwrap().starts_with("//!"))
        .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
        .collect();
    assert!(bad.is_empty(), "files without a //! first line: {bad:?}");
}
