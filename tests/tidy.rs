//! Architecture invariants checked by `cargo test` (rust-analyzer's tidy tests): the
//! crates' layer map of ARCHITECTURE.md (read from the manifests), "the engine never names
//! a method", kind names, who commits files, no circles of files, and ARCHITECTURE.md's
//! names. Each walks `src/` anew, so a new file or crate that breaks a rule fails here
//! without anyone listing it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates' layers, lowest first (ARCHITECTURE.md, "Crates"). A crate may depend only
/// on the crates its [`ALLOWED`] list names, each in its own layer or below; Cargo refuses
/// a circle and an import of a crate not depended on, so these lists are the layer map.
/// A method crate (any folder of `src/methods/` with a manifest) is in L4 and gets
/// [`METHOD_ALLOWED`]: never another method.
const LAYERS: &[(&str, &[&str])] = &[
    ("L0 leaves", &["synth-core", "synth-eval", "synth-retrieval", "synth-quality"]),
    ("L1 capabilities", &["synth-llm", "synth-embed"]),
    ("L2-L3 run services and stage API", &["synth-engine"]),
    ("L4 kinds, methods and provider kinds", &["synth-kinds", "<method>", "synth-providers"]),
    ("L5 compile and run", &["synth-runner"]),
    ("L6 front ends", &["synth-view", "synth-cli", "synth"]),
];

const ALLOWED: &[(&str, &[&str])] = &[
    ("synth-core", &[]),
    ("synth-eval", &["synth-core"]),
    ("synth-retrieval", &[]),
    ("synth-quality", &["synth-core"]),
    ("synth-llm", &["synth-core"]),
    ("synth-embed", &["synth-core", "synth-retrieval", "synth-llm"]),
    ("synth-engine", &["synth-core", "synth-quality", "synth-llm", "synth-embed"]),
    (
        "synth-kinds",
        &["synth-core", "synth-eval", "synth-retrieval", "synth-quality", "synth-llm", "synth-embed", "synth-engine"],
    ),
    ("synth-providers", &["synth-core", "synth-llm"]),
    ("synth-runner", &["synth-core", "synth-quality", "synth-llm", "synth-embed", "synth-engine"]),
    ("synth-view", &["synth-core", "synth-quality", "synth-runner"]),
    (
        "synth-cli",
        &[
            "synth-core",
            "synth-eval",
            "synth-retrieval",
            "synth-quality",
            "synth-llm",
            "synth-embed",
            "synth-engine",
            "synth-runner",
            "synth-view",
        ],
    ),
];

const METHOD_ALLOWED: &[&str] = &[
    "synth-core",
    "synth-eval",
    "synth-retrieval",
    "synth-quality",
    "synth-llm",
    "synth-embed",
    "synth-engine",
    "synth-kinds",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn src() -> PathBuf {
    repo().join("src")
}

fn manifest(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse().unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every crate of the workspace under `root` (a repository): name → (its folder relative
/// to `root`, the names of the workspace crates it depends on, normal dependencies only).
fn workspace(root: &Path) -> BTreeMap<String, (String, Vec<String>)> {
    let top = manifest(&root.join("Cargo.toml"));
    let members: Vec<String> = top["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .chain(std::iter::once(".".to_string()))
        .collect();
    let mut out = BTreeMap::new();
    for dir in members {
        let m = manifest(&root.join(&dir).join("Cargo.toml"));
        let name = m["package"]["name"].as_str().unwrap().to_string();
        let deps = m.get("dependencies").and_then(|d| d.as_table()).cloned().unwrap_or_default();
        let local: Vec<String> = deps
            .iter()
            .filter(|(_, v)| v.get("path").is_some())
            .map(|(k, v)| v.get("package").and_then(|p| p.as_str()).unwrap_or(k).to_string())
            .collect();
        out.insert(name, (dir, local));
    }
    out
}

fn is_method(dir: &str) -> bool {
    dir.starts_with("src/methods/")
}

fn layer(name: &str, dir: &str) -> usize {
    let key = if is_method(dir) { "<method>" } else { name };
    LAYERS
        .iter()
        .position(|(_, crates)| crates.contains(&key))
        .unwrap_or_else(|| panic!("crate \"{name}\" ({dir}) is in no layer: add it to LAYERS (and ARCHITECTURE.md)"))
}

/// Dependencies against the layer map, and folders under `src/` with a manifest that are
/// not in the workspace.
fn layer_violations(root: &Path) -> Vec<String> {
    let ws = workspace(root);
    let mut bad = Vec::new();
    for (name, (dir, deps)) in &ws {
        let allowed: Vec<&str> = if is_method(dir) {
            METHOD_ALLOWED.to_vec()
        } else if name == "synth" {
            ws.keys().filter(|k| *k != "synth").map(String::as_str).collect()
        } else {
            ALLOWED.iter().find(|(c, _)| c == name).map(|(_, a)| a.to_vec()).unwrap_or_default()
        };
        for d in deps {
            let Some((ddir, _)) = ws.get(d) else {
                bad.push(format!("{dir}/Cargo.toml ({name}) depends on {d}, not a workspace crate"));
                continue;
            };
            if layer(d, ddir) > layer(name, dir) {
                bad.push(format!(
                    "{dir}/Cargo.toml ({name}, {}) depends on {d} ({}): a layer above",
                    LAYERS[layer(name, dir)].0,
                    LAYERS[layer(d, ddir)].0
                ));
            } else if !allowed.contains(&d.as_str()) {
                bad.push(format!("{dir}/Cargo.toml ({name}) depends on {d}, which is not in its ALLOWED list"));
            }
        }
    }
    let dirs: BTreeSet<&str> = ws.values().map(|(d, _)| d.as_str()).collect();
    let mut manifests = Vec::new();
    cargo_files(&root.join("src"), &mut manifests);
    for m in manifests {
        let dir = m.parent().unwrap().strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
        if !dirs.contains(dir.as_str()) {
            bad.push(format!("{dir}/Cargo.toml is not a workspace member"));
        }
    }
    bad
}

fn cargo_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            cargo_files(&p, out);
        } else if p.file_name().is_some_and(|n| n == "Cargo.toml") {
            out.push(p);
        }
    }
}

#[test]
fn allowed_lists_respect_the_layers() {
    let dir_of = |c: &str| if c == "<method>" { "src/methods/x".to_string() } else { String::new() };
    for (name, deps) in ALLOWED {
        for d in *deps {
            assert!(layer(d, "") <= layer(name, ""), "ALLOWED lets {name} use {d}, a layer above");
        }
    }
    for d in METHOD_ALLOWED {
        assert!(layer(d, "") <= layer("<method>", &dir_of("<method>")), "METHOD_ALLOWED names {d}, a layer above");
    }
}

#[test]
fn crates_depend_only_on_the_layers_below() {
    let ws = workspace(&repo());
    assert!(ws.len() >= 10 && ws.contains_key("synth-core") && ws.contains_key("synth-rolemrc"), "{ws:?}");
    let bad = layer_violations(&repo());
    assert!(bad.is_empty(), "dependencies against the layer map (ARCHITECTURE.md, \"Crates\"):\n{}", bad.join("\n"));
}

/// The library crates that `[profile.release]` does not build as one code-generation unit
/// (Cargo.toml: the workspace's crates build side by side, a unit each; dependencies and
/// the `synth` package keep cargo's 16).
fn crates_not_one_unit(root: &Path) -> Vec<String> {
    let top = manifest(&root.join("Cargo.toml"));
    let packages = top["profile"]["release"].get("package").and_then(|p| p.as_table()).cloned().unwrap_or_default();
    let units = |name: &str| packages.get(name).and_then(|p| p.get("codegen-units")).and_then(|u| u.as_integer());
    let mut bad: Vec<String> = workspace(root)
        .into_keys()
        .filter(|name| name != "synth" && units(name) != Some(1))
        .map(|name| format!("{name}: no `[profile.release.package.{name}] codegen-units = 1`"))
        .collect();
    if units("synth").is_some_and(|u| u < 16) {
        bad.push("synth: its integration tests are the last unit of a test build; keep 16".into());
    }
    bad
}

#[test]
fn every_crate_builds_as_one_unit() {
    let bad = crates_not_one_unit(&repo());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let tmp = tempfile::tempdir().unwrap();
    copy_manifests(tmp.path());
    let top = tmp.path().join("Cargo.toml");
    let text = std::fs::read_to_string(&top).unwrap();
    let dropped = text.replacen("[profile.release.package.synth-view]\ncodegen-units = 1\n", "", 1);
    assert_ne!(dropped, text, "the synth-view entry moved: update this test");
    std::fs::write(&top, dropped).unwrap();
    let bad = crates_not_one_unit(tmp.path());
    assert!(bad.len() == 1 && bad[0].starts_with("synth-view:"), "{bad:?}");
}

/// A copy of the repository's manifests (Cargo.toml and every one under `src/`).
fn copy_manifests(to: &Path) {
    std::fs::copy(repo().join("Cargo.toml"), to.join("Cargo.toml")).unwrap();
    let mut manifests = Vec::new();
    cargo_files(&src(), &mut manifests);
    for m in manifests {
        let dest = to.join(m.strip_prefix(repo()).unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&m, &dest).unwrap();
    }
}

#[test]
fn a_dependency_against_the_layers_is_caught() {
    let tmp = tempfile::tempdir().unwrap();
    copy_manifests(tmp.path());
    let add = |dir: &str, dep: &str| {
        let path = tmp.path().join(dir).join("Cargo.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replacen("[dependencies]\n", &format!("[dependencies]\n{dep}\n"), 1)).unwrap();
    };
    // The providers' crate reaching up to the runner, a method reaching another method,
    // and a crate folder nobody added to the workspace.
    add("src/llm", "synth-runner = { path = \"../runner\" }");
    add("src/methods/rolemrc", "synth-sharp = { path = \"../sharp\" }");
    std::fs::create_dir_all(tmp.path().join("src/stray")).unwrap();
    std::fs::write(tmp.path().join("src/stray/Cargo.toml"), "[package]\nname = \"stray\"\n").unwrap();
    let bad = layer_violations(tmp.path());
    assert!(
        bad.iter().any(|b| b.contains("synth-llm") && b.contains("synth-runner") && b.contains("a layer above")),
        "{bad:?}"
    );
    assert!(bad.iter().any(|b| b.contains("synth-rolemrc") && b.contains("synth-sharp")), "{bad:?}");
    assert!(bad.iter().any(|b| b.contains("src/stray/Cargo.toml is not a workspace member")), "{bad:?}");
    assert!(layer_violations(&repo()).is_empty());
}

#[test]
fn a_file_that_names_a_method_outside_it_is_caught() {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&src(), tmp.path());
    std::fs::write(
        tmp.path().join("llm/shortcut.rs"),
        "//! A shortcut.\npub fn n() -> &'static str { synth_rolemrc::METHOD.name }\n",
    )
    .unwrap();
    let bad = method_mentions(tmp.path());
    assert!(bad.iter().any(|b| b.contains("src/llm/shortcut.rs")), "{bad:?}");
}

/// Code before `#[cfg(test)]` with comments removed (tests may reach anywhere).
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
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
        let c = code(&text);
        if !may_import
            && (c.contains("super::methods") || c.contains("methods::METHODS") || c.contains("crate::methods"))
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

/// The provider kinds: the `name` of every `ProviderDesc` static under `src/`.
fn provider_kinds() -> Vec<String> {
    let mut files = Vec::new();
    crate::support::rust_files(&src(), &mut files);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, _) in text.match_indices(": ProviderDesc = ProviderDesc {") {
            if let Some(name) = text[i..].split("name: \"").nth(1).and_then(|s| s.split('"').next()) {
                out.push(name.to_string());
            }
        }
    }
    out.sort();
    out
}

/// Code outside a provider kind's own module that tests a provider kind's name (`== "local"`,
/// `"openai" =>`): what a kind does is its descriptor's, which the registry lists. The
/// embedder kinds are `synth-embed`'s own (some share a name with a provider kind).
fn kind_name_checks(root: &Path, kinds: &[String]) -> Vec<String> {
    let mut files = Vec::new();
    crate::support::rust_files(root, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
        if rel.starts_with("providers/") || rel == "llm/offline.rs" || rel.starts_with("embed/") {
            continue;
        }
        let c = code(&std::fs::read_to_string(&f).unwrap());
        for k in kinds {
            let q = format!("\"{k}\"");
            for pat in [format!("== {q}"), format!("!= {q}"), format!("{q} =>"), format!("{q} |")] {
                if c.contains(&pat) {
                    bad.push(format!("src/{rel}: `{pat}` (a provider kind's name tested outside its module)"));
                }
            }
        }
    }
    bad
}

#[test]
fn provider_kinds_are_named_only_in_their_modules() {
    let kinds = provider_kinds();
    assert_eq!(kinds, ["anthropic", "local", "offline", "openai"]);
    let bad = kind_name_checks(&src(), &kinds);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // A check planted outside is caught.
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&src(), tmp.path());
    std::fs::write(
        tmp.path().join("engine/shortcut.rs"),
        "//! A shortcut.\npub fn paid(kind: &str) -> bool { kind == \"openai\" }\n",
    )
    .unwrap();
    let bad = kind_name_checks(tmp.path(), &kinds);
    assert!(bad.iter().any(|b| b.contains("src/engine/shortcut.rs")), "{bad:?}");
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
        // A kind's static (not `KindInfo::DEFAULT`, a const).
        let Some(i) = text.match_indices(": KindInfo = KindInfo {").map(|(i, _)| i).find(|&i| {
            let line_start = text[..i].rfind('\n').map_or(0, |s| s + 1);
            text[line_start..i].contains("static ")
        }) else {
            continue;
        };
        // What is a kind's own is never taken from `KindInfo::DEFAULT`.
        let body = &text[i..i + text[i..].find("\n};").unwrap_or(text.len() - i)];
        for field in ["name", "about", "options", "example", "build"] {
            let own = body.lines().any(|l| {
                let l = l.trim_start();
                l.strip_prefix(field).is_some_and(|r| r.starts_with(':') || r.starts_with(','))
            });
            if !own {
                bad.push(format!("src/{rel}: the kind's static takes its \"{field}\" from KindInfo::DEFAULT"));
            }
        }
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
    // directory through `src/kinds/external.rs` (ARCHITECTURE.md).
    let mut files = Vec::new();
    crate::support::rust_files(&src(), &mut files);
    // `regen/` commits its own files (snapshots, row indexes), never a stage's.
    let allowed = |rel: &str| {
        rel.starts_with("runner/dag/")
            || rel.starts_with("core/store/")
            || rel.starts_with("cli/")
            || rel.starts_with("runner/regen/")
            || rel == "kinds/external.rs"
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

/// The module path of a file under `src/` (`a/b.rs` and `a/b/mod.rs` → `a::b`).
fn module_of(rel: &str) -> Vec<String> {
    let rel = rel.trim_end_matches(".rs");
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The file of a module path, if it is a module of its own.
fn file_of(root: &Path, module: &[String]) -> Option<String> {
    if module.is_empty() {
        return Some("lib.rs".into());
    }
    let p = module.join("/");
    [format!("{p}.rs"), format!("{p}/mod.rs")].into_iter().find(|f| root.join(f).exists())
}

/// The paths a file's code names through `crate::`, `super::` or `self::`, each resolved to
/// the file of the deepest module it goes through (`use super::{a, b::C}` gives two).
fn imported_files(root: &Path, rel: &str, code: &str) -> BTreeSet<String> {
    let here = module_of(rel);
    let mut out = BTreeSet::new();
    for prefix in ["crate::", "super::", "self::"] {
        let mut i = 0;
        while let Some(pos) = code[i..].find(prefix) {
            let at = i + pos;
            i = at + prefix.len();
            let before = code[..at].chars().next_back();
            // Part of a longer name or path (`$crate::`, `super::super::` after its first).
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':') {
                continue;
            }
            let mut base: Vec<String> = match prefix {
                "crate::" => Vec::new(),
                "self::" => here.clone(),
                _ => here[..here.len().saturating_sub(1)].to_vec(),
            };
            let mut rest = &code[i..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            // One path, or a `{...}` group of them (the first segment of each is enough).
            let heads: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 1;
                let end = group
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '{' => 1,
                            '}' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map(|(e, _)| e)
                    .unwrap_or(group.len());
                let (mut items, mut depth, mut cur) = (Vec::new(), 0, String::new());
                for c in group[..end].chars() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => items.push(std::mem::take(&mut cur)),
                        _ if depth == 0 => cur.push(c),
                        _ => {}
                    }
                }
                items.push(cur);
                items.into_iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
            } else {
                let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
                vec![rest[..end].to_string()]
            };
            for head in heads {
                let mut module = base.clone();
                for seg in head.split("::").map(|s| s.trim()).filter(|s| !s.is_empty()) {
                    let seg = seg.split([' ', '{']).next().unwrap_or_default();
                    let mut next = module.clone();
                    next.push(seg.to_string());
                    if seg == "self" || file_of(root, &next).is_none() {
                        break;
                    }
                    module = next;
                }
                if let Some(f) = file_of(root, &module) {
                    out.insert(f);
                }
            }
        }
    }
    // A child module named without a prefix (`mod filter;` ... `filter::KIND`).
    for line in code.lines() {
        let decl = line.trim_start().trim_start_matches("pub ").trim_start_matches("pub(crate) ");
        let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) else { continue };
        let mut child = here.clone();
        child.push(name.trim().to_string());
        let Some(file) = file_of(root, &child) else { continue };
        let needle = format!("{}::", name.trim());
        let mut i = 0;
        while let Some(pos) = code[i..].find(&needle) {
            let at = i + pos;
            i = at + needle.len();
            let before = code[..at].chars().next_back();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                out.insert(file.clone());
                break;
            }
        }
    }
    out.remove(rel);
    out
}

/// The crates' folders under a `src/` folder: each folder with a manifest, and `src/`
/// itself (the `synth` crate: the files in no other crate's folder).
fn crate_dirs(src: &Path) -> Vec<PathBuf> {
    let mut manifests = Vec::new();
    cargo_files(src, &mut manifests);
    let mut dirs: Vec<PathBuf> = manifests.iter().map(|m| m.parent().unwrap().to_path_buf()).collect();
    dirs.push(src.to_path_buf());
    dirs
}

/// Circles of files that import each other inside one crate (each as `a.rs <-> b.rs`);
/// between crates Cargo refuses them.
fn import_circles(src: &Path) -> Vec<String> {
    let dirs = crate_dirs(src);
    let mut out = Vec::new();
    for root in &dirs {
        let mut files = Vec::new();
        crate::support::rust_files(root, &mut files);
        // A file is its deepest crate folder's.
        files.retain(|f| dirs.iter().filter(|d| f.starts_with(d)).max_by_key(|d| d.components().count()) == Some(root));
        let prefix = root.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
        let prefix = if prefix.is_empty() { "src/".to_string() } else { format!("src/{prefix}/") };
        out.extend(
            crate_circles(root, &files)
                .into_iter()
                .map(|c| c.split(" <-> ").map(|f| format!("{prefix}{f}")).collect::<Vec<_>>().join(" <-> ")),
        );
    }
    out
}

/// Circles among `files` of the crate whose folder is `root`.
fn crate_circles(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let rels: Vec<String> =
        files.iter().map(|f| f.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/")).collect();
    let index = |r: &str| rels.iter().position(|x| x == r);
    let edges: Vec<Vec<usize>> = rels
        .iter()
        .zip(files)
        .map(|(rel, f)| {
            let text = std::fs::read_to_string(f).unwrap();
            imported_files(root, rel, &code(&text)).iter().filter_map(|t| index(t)).collect()
        })
        .collect();
    // Strongly connected components (Tarjan); every one of two or more files is a circle.
    struct Tarjan<'a> {
        edges: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in &self.edges[v] {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let n = rels.len();
    let mut t = Tarjan {
        edges: &edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    t.out.iter().map(|scc| scc.iter().map(|&v| rels[v].clone()).collect::<Vec<_>>().join(" <-> ")).collect()
}

#[test]
fn no_files_import_each_other() {
    let circles = import_circles(&src());
    assert!(
        circles.is_empty(),
        "files that import each other (a circle; move what both need below them, as `stages/` did with \
         `src/kinds/` and `view/` with `app.rs`):\n{}",
        circles.join("\n")
    );
}

#[test]
fn a_circle_of_files_is_caught() {
    // A copy of src/ where the batch types' file reads the OpenAI provider's file, which reads it.
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&src(), tmp.path());
    let batch = tmp.path().join("llm/batch.rs");
    let text = std::fs::read_to_string(&batch).unwrap();
    std::fs::write(
        &batch,
        text.replacen("\nuse ", "\nuse super::{openai::OpenAiChat, error::ErrorKind as _E};\nuse ", 1),
    )
    .unwrap();
    let circles = import_circles(tmp.path());
    assert!(circles.iter().any(|c| c.contains("src/llm/batch.rs") && c.contains("src/llm/openai.rs")), "{circles:?}");
    // Nested groups and `super::super::` resolve to files too.
    let set = imported_files(
        &tmp.path().join("providers"),
        "local/engine.rs",
        "use super::super::{openai::{A, B}, anthropic};\nuse crate::local::template::X;",
    );
    assert_eq!(
        set.into_iter().collect::<Vec<_>>(),
        ["anthropic.rs", "local/template.rs", "openai/mod.rs"].map(String::from).to_vec()
    );
}

/// The text of ARCHITECTURE.md between single backticks (code fences left out).
fn architecture_names() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        out.extend(line.split('`').skip(1).step_by(2).map(str::to_string));
    }
    out
}

/// The repository's files and folders (relative, `/`-separated; build outputs, tools and
/// runs left out).
fn repo_paths() -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            if ["target", ".git", ".tools", "outputs", "node_modules"].contains(&rel.as_str()) {
                continue;
            }
            if p.is_dir() {
                out.insert(format!("{rel}/"));
                walk(root, &p, out);
            } else {
                out.insert(rel);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&repo(), &repo(), &mut out);
    out
}

/// Where a Rust path of ARCHITECTURE.md starts: the folder or file of its first segment
/// (the `synth` crate's module names, or a crate's).
fn rust_root(first: &str) -> Option<&'static str> {
    Some(match first {
        "config" | "data" | "store" | "hub" | "rng" | "secrets" | "template" | "progress" | "onnx" | "fetch" => {
            return ["config", "data", "store", "hub", "rng", "secrets", "template", "progress", "onnx", "fetch"]
                .iter()
                .position(|m| *m == first)
                .map(|i| {
                    [
                        "src/core/config",
                        "src/core/data",
                        "src/core/store",
                        "src/core/hub",
                        "src/core/rng",
                        "src/core/secrets",
                        "src/core/template",
                        "src/core/progress",
                        "src/core/onnx",
                        "src/core/fetch",
                    ][i]
                });
        }
        "services" => "src/engine/services",
        "stages" => "src/engine/stages",
        "pipeline" => "src/runner/pipeline",
        "dag" => "src/runner/dag",
        "regen" => "src/runner/regen",
        "llm" | "synth_llm" => "src/llm",
        "embed" | "synth_embed" => "src/embed",
        "eval" | "synth_eval" => "src/eval",
        "retrieval" | "synth_retrieval" => "src/retrieval",
        "quality" | "synth_quality" => "src/quality",
        "view" | "synth_view" => "src/view",
        "kinds" | "synth_kinds" => "src/kinds",
        "methods" => "src/methods",
        "providers" | "synth_providers" => "src/providers",
        "cli" | "synth_cli" => "src/cli",
        "bench" => "src/cli/bench",
        "registry" => "src/registry",
        "synth_core" => "src/core",
        "synth_engine" => "src/engine",
        "synth_runner" => "src/runner",
        "synth" => "src",
        _ => return None,
    })
}

/// The file of module `base` (`a` → `a.rs`, `a/mod.rs` or `a/lib.rs`).
fn module_file(base: &Path) -> Option<PathBuf> {
    let dir = base.to_path_buf();
    [base.with_extension("rs"), dir.join("mod.rs"), dir.join("lib.rs")].into_iter().find(|f| f.is_file())
}

/// Why a Rust path of ARCHITECTURE.md (`dag::runner::run`, `synth_engine::registry::Registry`)
/// names nothing, if it does not: its modules must be files and its first item must be in
/// the last module's file.
fn stale_rust_path(name: &str) -> Option<String> {
    let segs: Vec<&str> = name.trim_end_matches("()").split("::").collect();
    let mut base = repo().join(rust_root(segs[0])?);
    let mut file = module_file(&base)?;
    for seg in &segs[1..] {
        if seg.is_empty() || !seg.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return None;
        }
        let next = base.join(seg);
        if let Some(f) = module_file(&next) {
            base = next;
            file = f;
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let found = text.match_indices(seg).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + seg.len()..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        });
        return (!found).then(|| format!("`{name}`: no `{seg}` in {}", file.strip_prefix(repo()).unwrap().display()));
    }
    None
}

#[test]
fn architecture_names_what_exists() {
    let paths = repo_paths();
    let ws = workspace(&repo());
    let names = architecture_names();
    let mut bad = Vec::new();
    let file_like = |n: &str| {
        // Paths of this repository (`../shared/...` and other projects' sources are not).
        let exts = [".rs", ".md", ".sh", ".html", ".j2"];
        let tracked_dirs = ["src/", "tests/", "benches/", "docs/", "pipelines/", "seeds/", "rules/", ".ci/"];
        !n.starts_with("../")
            && !n.contains([' ', '<', '*', '{', '$'])
            && (exts.iter().any(|e| n.ends_with(e))
                || (n.ends_with('/') && tracked_dirs.iter().any(|d| n.starts_with(d))))
    };
    let mut checked = 0;
    for n in &names {
        // `file.rs:123` and `file.rs::item` name the file.
        let n = n.split("::").next().unwrap();
        let n = n.split(':').next().unwrap();
        if !file_like(n) {
            continue;
        }
        checked += 1;
        let found = paths.contains(n) || paths.iter().any(|p| p.ends_with(&format!("/{n}")));
        if !found {
            bad.push(format!("`{n}`: no such file or folder"));
        }
    }
    for n in &names {
        // `synth-net` names the network runtime's threads.
        if n.starts_with("synth-") && n != "synth-net" && n.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
            checked += 1;
            if !ws.contains_key(n.as_str()) {
                bad.push(format!("`{n}`: no such crate"));
            }
        }
        if n.contains("::") && !n.contains([' ', '<', '(', '"']) || n.ends_with("()") && n.contains("::") {
            checked += 1;
            bad.extend(stale_rust_path(n));
        }
    }
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    for name in ws.keys() {
        if !text.contains(name.as_str()) {
            bad.push(format!("the crate {name} is not in ARCHITECTURE.md"));
        }
    }
    assert!(checked > 200, "only {checked} names checked: is the parsing broken?");
    assert!(bad.is_empty(), "ARCHITECTURE.md names what is not there:\n{}", bad.join("\n"));
}

#[test]
fn a_stale_architecture_name_is_caught() {
    assert!(stale_rust_path("dag::runner::run").is_none());
    assert!(stale_rust_path("synth_engine::registry::Registry").is_none());
    assert!(stale_rust_path("llm::provider::no_such_function").is_some());
    assert!(stale_rust_path("pipeline::graph::Graph").is_none());
}
