//! One language's claim rules, read from `rules/sharp/<lang>/` (data, not code; README
//! there): `phrases.tsv` (relation phrases with their negated and absolutely qualified
//! forms), `antonyms.tsv` (a lexicon used both ways) and `templates.tsv` (a claim per
//! relation for edges without surface text). A bad line is an error naming `file:line`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The files of a language folder.
pub const FILES: [&str; 3] = ["phrases.tsv", "antonyms.tsv", "templates.tsv"];

/// A relation phrase and its counterfactual forms.
#[derive(Debug, Clone, PartialEq)]
pub struct Phrase {
    pub phrase: String,
    pub negated: String,
    /// `None` where the file says `-`.
    pub qualified: Option<String>,
}

/// A language's rules.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub lang: String,
    pub phrases: Vec<Phrase>,
    /// word → antonym, both directions (the first pair naming a word wins).
    pub antonyms: HashMap<String, String>,
    /// The lexicon's words, longest first (ties in file order): Chinese claims are searched
    /// for them as substrings.
    pub antonym_words: Vec<String>,
    /// relation (without `/r/`) → template with `{start}` and `{end}`.
    pub templates: HashMap<String, String>,
}

/// The data lines of a tab-separated rules file: `(line number, columns)`, without blank
/// lines and `#` comments; columns are trimmed of `\r` only (phrases keep inner spaces).
pub fn tsv(text: &str) -> impl Iterator<Item = (usize, Vec<&str>)> {
    text.lines().enumerate().filter_map(|(i, line)| {
        let line = line.trim_end_matches('\r');
        (!line.trim().is_empty() && !line.trim_start().starts_with('#'))
            .then(|| (i + 1, line.split('\t').map(str::trim).collect()))
    })
}

impl Rules {
    /// The files [`Rules::load`] reads.
    pub fn files(dir: &Path, lang: &str) -> Vec<PathBuf> {
        FILES.iter().map(|f| dir.join(lang).join(f)).collect()
    }

    /// Reads `<dir>/<lang>/{phrases,antonyms,templates}.tsv`; `shown` is how `dir` is named
    /// in errors (the path as configured).
    pub fn load(dir: &Path, shown: &str, lang: &str) -> Result<Rules, String> {
        let mut texts = Vec::new();
        for f in FILES {
            let path = dir.join(lang).join(f);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!("{shown}/{lang}/{f}: {e} (a rules folder holds {} per language)", FILES.join(", "))
            })?;
            texts.push((format!("{shown}/{lang}/{f}"), text));
        }
        Rules::parse(lang, [(&texts[0].0, &texts[0].1), (&texts[1].0, &texts[1].1), (&texts[2].0, &texts[2].1)])
    }

    /// The rules from the three files' `(name, text)`, in [`FILES`] order.
    pub fn parse(lang: &str, files: [(&str, &str); 3]) -> Result<Rules, String> {
        let mut r = Rules { lang: lang.to_string(), ..Default::default() };
        let [(pname, ptext), (aname, atext), (tname, ttext)] = files;
        for (n, cols) in tsv(ptext) {
            let [phrase, negated, qualified] = cols.as_slice() else {
                return Err(format!(
                    "{pname}:{n}: expected 3 tab-separated columns (phrase, negated, qualified or -), got {}",
                    cols.len()
                ));
            };
            if phrase.is_empty() || negated.is_empty() || qualified.is_empty() {
                return Err(format!("{pname}:{n}: an empty column (write - for no qualified form)"));
            }
            r.phrases.push(Phrase {
                phrase: phrase.to_string(),
                negated: negated.to_string(),
                qualified: (*qualified != "-").then(|| qualified.to_string()),
            });
        }
        for (n, cols) in tsv(atext) {
            let [a, b] = cols.as_slice() else {
                return Err(format!(
                    "{aname}:{n}: expected 2 tab-separated columns (word, antonym), got {}",
                    cols.len()
                ));
            };
            if a.is_empty() || b.is_empty() || a == b {
                return Err(format!("{aname}:{n}: a word and a different antonym are needed"));
            }
            for (w, x) in [(a, b), (b, a)] {
                if !r.antonyms.contains_key(*w) {
                    r.antonyms.insert(w.to_string(), x.to_string());
                    r.antonym_words.push(w.to_string());
                }
            }
        }
        r.antonym_words.sort_by_key(|w| std::cmp::Reverse(w.chars().count()));
        for (n, cols) in tsv(ttext) {
            let [rel, template] = cols.as_slice() else {
                return Err(format!(
                    "{tname}:{n}: expected 2 tab-separated columns (relation, template), got {}",
                    cols.len()
                ));
            };
            if !template.contains("{start}") || !template.contains("{end}") {
                return Err(format!("{tname}:{n}: the template of {rel} needs both {{start}} and {{end}}"));
            }
            if r.templates.insert(rel.trim_start_matches("/r/").to_string(), template.to_string()).is_some() {
                return Err(format!("{tname}:{n}: {rel} has a template already"));
            }
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_rules(lang: &str) -> Rules {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../..")).join("rules/sharp");
        Rules::load(&dir, "rules/sharp", lang).unwrap()
    }

    #[test]
    fn the_shipped_rules_load() {
        for lang in ["en", "zh"] {
            let r = repo_rules(lang);
            assert!(r.phrases.len() > 10 && r.antonyms.len() > 40 && r.templates.len() == 17, "{lang}");
        }
        let en = repo_rules("en");
        assert_eq!(en.antonyms["easy"], "hard");
        assert_eq!(en.templates["IsA"], "{start} is a type of {end}");
        let zh = repo_rules("zh");
        assert_eq!(zh.antonym_words[0].chars().count(), 2, "longest first");
    }

    #[test]
    fn bad_lines_name_file_and_line() {
        let ok = ("p.tsv", "# c\nis\tis not\t-\n");
        let e = Rules::parse("en", [ok, ("a.tsv", "hot\tcold\nwarm\n"), ("t.tsv", "")]).unwrap_err();
        assert_eq!(e, "a.tsv:2: expected 2 tab-separated columns (word, antonym), got 1");
        let e = Rules::parse("en", [("p.tsv", "\n\nis\tis not\n"), ("a.tsv", ""), ("t.tsv", "")]).unwrap_err();
        assert!(e.starts_with("p.tsv:3: expected 3"), "{e}");
        let e = Rules::parse("en", [ok, ("a.tsv", ""), ("t.tsv", "IsA\t{start} is a\n")]).unwrap_err();
        assert!(e.starts_with("t.tsv:1: the template of IsA needs"), "{e}");
        let r = Rules::parse("en", [ok, ("a.tsv", ""), ("t.tsv", "")]).unwrap();
        assert_eq!(r.phrases[0].qualified, None);
    }
}
