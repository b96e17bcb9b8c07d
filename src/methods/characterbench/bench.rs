//! The benchmark definition, read from data (`pipelines/prompts/characterbench/
//! dimensions.json`): languages (the user label of the judge transcript, the role-play
//! template, what counts as no greeting, where a language's copy of a record lives),
//! the six aspects, and the 13 dimension files in Table 4 order with their score scale
//! (the fixed scale table: never the maximum of the data, P12), aspect, judge template
//! per language and judge-input rules. Templates are read when the file is, and each
//! judge template must use only the slots its dimension provides.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use synth_core::data::python;

/// The default definition file.
pub const DEFAULT_FILE: &str = "pipelines/prompts/characterbench/dimensions.json";

/// The judge slots every dimension fills (the target slot comes on top).
pub const COMMON_SLOTS: &[&str] = &["character_profile", "dialogue", "user_query", "character_response"];

#[derive(Debug, Clone, Deserialize)]
pub struct Language {
    /// Label of the user's lines in the judge transcript (`用户` / `User`).
    pub user: String,
    /// Role-play template, relative to the definition file.
    pub roleplay: String,
    /// Greeting values that count as none (en: `N/A`).
    #[serde(default)]
    pub greeting_none: Vec<String>,
    /// The key holding this language's copy of a record (`translation_en`); none: the record itself.
    #[serde(default)]
    pub record: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Aspect {
    pub id: String,
    pub heading: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Target {
    /// Dotted path in the record (the language's copy).
    pub path: String,
    /// `lines`: one `<name>：<item>\n` per list item; `value`: Python's `str()`.
    pub render: String,
    /// The template slot per language.
    pub slot: BTreeMap<String, String>,
    /// A language's copy may lack it: then the path in the record itself.
    #[serde(default)]
    pub zh_fallback: bool,
    /// The judge's profile is the profile followed by the target (BCh).
    #[serde(default)]
    pub append_to_profile: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Dimension {
    pub id: String,
    pub abbr: String,
    pub heading: String,
    pub aspect: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub scale: (i64, i64),
    /// Judge template per language, relative to the definition file.
    pub judge: BTreeMap<String, String>,
    pub blank_dialogue: bool,
    #[serde(default)]
    pub target: Option<Target>,
}

#[derive(Debug, Deserialize)]
struct File {
    languages: BTreeMap<String, Language>,
    aspects: Vec<Aspect>,
    dimensions: Vec<Dimension>,
}

/// The definition with its templates loaded.
#[derive(Debug, Clone)]
pub struct Bench {
    pub languages: BTreeMap<String, Language>,
    pub aspects: Vec<Aspect>,
    pub dimensions: Vec<Dimension>,
    /// Template text by path (relative to the definition file).
    pub templates: BTreeMap<String, String>,
    /// Every file read (for fingerprints).
    pub files: Vec<PathBuf>,
}

impl Bench {
    /// Read and check a definition file and the templates it names.
    pub fn read(path: &Path) -> Result<Bench, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let f: File = serde_json::from_str(&text)
            .map_err(|e| format!("{}: line {} column {}: {e}", path.display(), e.line(), e.column()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let bad = |m: String| format!("{}: {m}", path.display());
        let mut templates = BTreeMap::new();
        let mut files = vec![path.to_path_buf()];
        let mut load = |rel: &str, templates: &mut BTreeMap<String, String>| -> Result<Vec<String>, String> {
            let full = dir.join(rel);
            let t = std::fs::read_to_string(&full).map_err(|e| format!("{}: {e}", full.display()))?;
            let fields = python::format_fields(&t).map_err(|e| format!("{}: {e}", full.display()))?;
            if !templates.contains_key(rel) {
                files.push(full);
            }
            templates.insert(rel.to_string(), t);
            Ok(fields)
        };
        for (lang, l) in &f.languages {
            let fields = load(&l.roleplay, &mut templates)?;
            for field in &fields {
                if !["character_profile", "user_profile", "dialogue"].contains(&field.as_str()) {
                    return Err(bad(format!("language {lang}: role-play template {} uses {{{field}}}", l.roleplay)));
                }
            }
        }
        for (i, d) in f.dimensions.iter().enumerate() {
            if f.dimensions[..i].iter().any(|e| e.id == d.id || e.abbr == d.abbr) {
                return Err(bad(format!("dimension \"{}\" ({}) listed twice", d.id, d.abbr)));
            }
            if !f.aspects.iter().any(|a| a.id == d.aspect) {
                return Err(bad(format!("dimension \"{}\": unknown aspect \"{}\"", d.id, d.aspect)));
            }
            if d.scale.0 >= d.scale.1 {
                return Err(bad(format!("dimension \"{}\": scale {:?} is not [min, max]", d.id, d.scale)));
            }
            for lang in f.languages.keys() {
                let Some(rel) = d.judge.get(lang) else {
                    return Err(bad(format!("dimension \"{}\" has no judge template for {lang}", d.id)));
                };
                let fields = load(rel, &mut templates)?;
                let target_slot = d.target.as_ref().and_then(|t| t.slot.get(lang));
                if d.target.is_some() && target_slot.is_none() {
                    return Err(bad(format!("dimension \"{}\": no target slot for {lang}", d.id)));
                }
                for field in &fields {
                    if !COMMON_SLOTS.contains(&field.as_str()) && Some(field) != target_slot {
                        return Err(bad(format!(
                            "dimension \"{}\" ({lang}): the judge template {rel} uses {{{field}}}, which the dimension does not fill",
                            d.id
                        )));
                    }
                }
            }
            if let Some(t) = &d.target
                && !["lines", "value"].contains(&t.render.as_str())
            {
                return Err(bad(format!("dimension \"{}\": target render \"{}\" (lines, value)", d.id, t.render)));
            }
        }
        Ok(Bench { languages: f.languages, aspects: f.aspects, dimensions: f.dimensions, templates, files })
    }

    pub fn dimension(&self, id: &str) -> Option<&Dimension> {
        self.dimensions.iter().find(|d| d.id == id)
    }

    /// The ids, for messages.
    pub fn ids(&self) -> String {
        self.dimensions.iter().map(|d| d.id.as_str()).collect::<Vec<_>>().join(", ")
    }

    pub fn template(&self, rel: &str) -> &str {
        self.templates.get(rel).map(String::as_str).unwrap_or_default()
    }
}
