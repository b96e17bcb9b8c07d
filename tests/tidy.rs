//! Architecture invariants checked by `cargo test` (rust-analyzer's tidy tests): the
//! layer map of ARCHITECTURE.md, "the engine never names a method", kind names, and
//! who commits files. Each walks `src/` anew, so a new file that breaks a rule fails
//! here without anyone listing it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layers, lowest first: a unit may use units of its own layer or below, and
/// only those listed in [`ALLOWED`]. A unit is a top-level module of `src/`, except
/// that `stages/` (the stage API, L3) is apart from the engine's kinds in
/// `stages/kinds/` (L4).
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

/// The front ends (L6), lowest first: one may use those before it, never one after it
/// (`view` shows what `dag` and `store` read, it does not call the command line).
const FRONT_ENDS: &[&str] = &["view", "bench", "cli", "lib", "main"];

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
    ("pipeline", &["config", "registry", "stages::api", "llm", "embed", "data", "template"]),
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
        return if rel.starts_with("stages/kinds/") { "stages::kinds" } else { "stages::api" }.into();
    }
    first
}

/// The unit a `crate::` path names (`crate::stages::kinds::llm` → the kinds; any other
/// `crate::stages` path → the API).
fn unit_of_path(path: &str) -> String {
    let mut parts = path.split("::");
    let first = parts.next().unwrap_or_default();
    if first == "stages" {
        return if parts.next() == Some("kinds") { "stages::kinds" } else { "stages::api" }.into();
    }
    first.to_string()
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
            let rank = |u: &str| FRONT_ENDS.iter().position(|f| *f == u);
            if front_end && to == from && rank(&target) > rank(&unit) {
                bad.push(format!(
                    "src/{rel} ({unit}) uses crate::{path} ({target}): a front end after it (FRONT_ENDS)"
                ));
            } else if to > from {
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
    // And a viewer that calls the command line, a front end after it.
    std::fs::write(tmp.path().join("view/shortcut.rs"), "//! A shortcut.\npub fn n() -> i32 { crate::cli::EXIT_OK }\n")
        .unwrap();
    let bad = layer_violations(tmp.path());
    assert!(bad.iter().any(|b| b.contains("src/llm/shortcut.rs")), "{bad:?}");
    assert!(bad.iter().any(|b| b.contains("src/view/shortcut.rs") && b.contains("FRONT_ENDS")), "{bad:?}");
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
    // directory through `stages/kinds/external.rs` (ARCHITECTURE.md).
    let mut files = Vec::new();
    crate::support::rust_files(&src(), &mut files);
    // `regen/` commits its own files (snapshots, row indexes), never a stage's.
    let allowed = |rel: &str| {
        rel.starts_with("dag/")
            || rel.starts_with("store/")
            || rel.starts_with("cli/")
            || rel.starts_with("regen/")
            || rel == "stages/kinds/external.rs"
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

/// Circles of files that import each other (each as `a.rs <-> b.rs`).
fn import_circles(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    crate::support::rust_files(root, &mut files);
    let rels: Vec<String> =
        files.iter().map(|f| f.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/")).collect();
    let index = |r: &str| rels.iter().position(|x| x == r);
    let edges: Vec<Vec<usize>> = rels
        .iter()
        .zip(&files)
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
    t.out.iter().map(|scc| scc.iter().map(|&v| format!("src/{}", rels[v])).collect::<Vec<_>>().join(" <-> ")).collect()
}

#[test]
fn no_files_import_each_other() {
    let circles = import_circles(&src());
    assert!(
        circles.is_empty(),
        "files that import each other (a circle; move what both need below them, as `stages/` did with \
         `kinds/` and `view/` with `app.rs`):\n{}",
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
        tmp.path(),
        "llm/local/engine.rs",
        "use super::super::{batch::{A, B}, rate};\nuse crate::dag::shard::X;",
    );
    assert_eq!(
        set.into_iter().collect::<Vec<_>>(),
        ["dag/shard.rs", "llm/batch.rs", "llm/rate.rs"].map(String::from).to_vec()
    );
}
