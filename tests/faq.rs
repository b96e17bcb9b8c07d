//! docs/faq.md quotes the messages synth prints, in blocks fenced as ```` ```text faq-message ````;
//! this checks that each quoted line's stable text is still written by synth's source, so a
//! message reworded or removed in `src/` fails here, naming the FAQ entry and the text.
//!
//! A quoted line is cut where the run fills in something: at `…` (the FAQ's mark for a stage,
//! a path, a server's words), at `"` (names are quoted, and written `\"` in Rust), at digits
//! (counts, statuses) and at `: ` / `; ` (where messages are joined: `context: cause`). Each
//! piece of [`MIN_PIECE`] characters or more, trimmed of spaces and `.,;:()`, must occur in a
//! `.rs` file under `src/` (its unit tests left out, string continuations joined).

use std::path::Path;

/// Shorter pieces (`stage`, `HTTP 401`, `(auth)`) are too common to say anything.
const MIN_PIECE: usize = 12;
/// So the test cannot pass on an emptied page.
const MIN_ENTRIES: usize = 10;
const FENCE: &str = "```text faq-message";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A `\` ending a line inside a string literal continues the string after the next line's
/// indentation: join them, as the compiler does.
fn join_continuations(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(i) = rest.find("\\\n") {
        out.push_str(&rest[..i]);
        rest = rest[i + 2..].trim_start_matches([' ', '\t']);
    }
    out.push_str(rest);
    out
}

/// Every `.rs` file under `src/`, without its `#[cfg(test)] mod ...` (an assertion quoting a
/// message is not the message), as one text; `{{` and `}}` as `format!` prints them.
fn source_text() -> String {
    let mut files = Vec::new();
    crate::support::rust_files(&root().join("src"), &mut files);
    assert!(!files.is_empty(), "no .rs file under {}", root().join("src").display());
    let mut all = String::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
        let code = match text.find("\n#[cfg(test)]\nmod ") {
            Some(i) => &text[..i],
            None => &text[..],
        };
        all.push_str(&join_continuations(code));
        all.push('\n');
    }
    all.replace("{{", "{").replace("}}", "}")
}

/// One quoted block: its FAQ entry (the `###` heading above it) and its lines with their
/// line numbers in the page.
struct Quote {
    entry: String,
    lines: Vec<(usize, String)>,
}

fn quotes(page: &str) -> Vec<Quote> {
    let mut out = Vec::new();
    let mut entry: Option<String> = None;
    let mut open: Option<Quote> = None;
    for (i, line) in page.lines().enumerate() {
        let no = i + 1;
        if let Some(q) = open.as_mut() {
            if line.trim_start().starts_with("```") {
                out.push(open.take().expect("open"));
            } else {
                q.lines.push((no, line.to_string()));
            }
            continue;
        }
        if let Some(h) = line.strip_prefix("### ") {
            entry = Some(h.trim().to_string());
        } else if line.starts_with("## ") || line.starts_with("# ") {
            entry = None;
        }
        if line.trim_end() == FENCE {
            let entry = entry.clone().unwrap_or_else(|| {
                panic!("docs/faq.md:{no}: a {FENCE} block outside an entry (put it under a `###` heading)")
            });
            open = Some(Quote { entry, lines: Vec::new() });
        }
    }
    if let Some(q) = open {
        panic!("docs/faq.md: the {FENCE} block of entry \"{}\" is not closed", q.entry);
    }
    out
}

/// A log line's time stamp and level (`… WARN provider …`) are not part of the message.
fn without_log_prefix(line: &str) -> &str {
    let rest = line.trim_start_matches(['…', ' ']);
    for level in ["ERROR ", "WARN ", "INFO "] {
        if let Some(r) = rest.strip_prefix(level) {
            return r;
        }
    }
    line
}

/// The stable pieces of a quoted line that are long enough to check (see the module doc).
fn pieces(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    for a in without_log_prefix(line).split(['…', '"']) {
        for b in a.split(": ").flat_map(|b| b.split("; ")) {
            for c in b.split(|ch: char| ch.is_ascii_digit()) {
                let c = c.trim_matches(|ch: char| ch.is_whitespace() || ".,;:()".contains(ch));
                if c.chars().count() >= MIN_PIECE {
                    out.push(c.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn faq_messages_are_still_in_the_source() {
    let path = root().join("docs/faq.md");
    let page = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let quotes = quotes(&page);
    let mut entries: Vec<&str> = quotes.iter().map(|q| q.entry.as_str()).collect();
    entries.dedup();
    assert!(
        entries.len() >= MIN_ENTRIES,
        "docs/faq.md has {} entries with a {FENCE} block; at least {MIN_ENTRIES} are expected",
        entries.len()
    );
    let source = source_text();
    let mut problems = Vec::new();
    for q in &quotes {
        let mut checked = 0;
        for (no, line) in &q.lines {
            for piece in pieces(line) {
                checked += 1;
                if !source.contains(&piece) {
                    problems.push(format!(
                        "docs/faq.md:{no}: entry \"{}\": \"{piece}\" is in no .rs file under src/ any more \
                         (the message changed: quote what synth prints now, `…` for what a run fills in)",
                        q.entry
                    ));
                }
            }
        }
        if checked == 0 {
            let no = q.lines.first().map_or(0, |(no, _)| *no);
            problems.push(format!(
                "docs/faq.md:{no}: entry \"{}\": its {FENCE} block has no piece of {MIN_PIECE}+ characters \
                 to check (quote more of the message)",
                q.entry
            ));
        }
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn pieces_cut_where_a_run_fills_in() {
    assert_eq!(
        pieces("error: stage \"…\": 1 of 60 records failed (1.7% > max_failure_ratio 1.0%); all failures are in …"),
        ["records failed", "% > max_failure_ratio", "all failures are in"]
    );
    assert_eq!(
        pieces("… WARN provider \"…\" has failed continuously for …s (last: …)"),
        ["has failed continuously for"]
    );
    assert_eq!(
        join_continuations("\"newer), \\\n                        set `ort_dylib`\""),
        "\"newer), set `ort_dylib`\""
    );
}
