//! RoleEval's prompt format (spec §3.1–3.2): the language file
//! (`pipelines/prompts/roleeval/<lang>.json`: header, answer cue, choice letters,
//! categories with their paper codes and prompt words, subsets) and the pure
//! rendering of zero- and k-shot prompts, byte for byte as C-Eval's
//! `format_example` lays them out, and of C-Eval's chat message variant.

use std::path::Path;

use serde::Deserialize;

use synth_core::data::chat::Role;
use synth_llm::Message;

#[derive(Debug, Clone, Deserialize)]
pub struct Category {
    /// File stem in the release (`celebrities`).
    pub stem: String,
    /// Column heading in the paper's tables (`CE`).
    pub code: String,
    /// The word in the prompt header (`名人`).
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Subset {
    pub stem: String,
    pub heading: String,
}

/// A language file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Format {
    pub lang: String,
    /// The instruction line; `{category}` is replaced by the category's `name`.
    pub header: String,
    pub answer_cue: String,
    pub choices: Vec<String>,
    pub ceval_system_prefix: String,
    pub categories: Vec<Category>,
    pub subsets: Vec<Subset>,
}

impl Format {
    pub fn read(path: &Path) -> Result<Format, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let f: Format = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if !f.header.contains("{category}") {
            return Err(format!("{}: header has no {{category}}", path.display()));
        }
        if f.choices.is_empty() || f.categories.is_empty() || f.subsets.is_empty() {
            return Err(format!("{}: choices, categories and subsets must not be empty", path.display()));
        }
        Ok(f)
    }

    pub fn category(&self, stem: &str) -> Option<&Category> {
        self.categories.iter().find(|c| c.stem == stem)
    }

    /// The header line for a category, without the blank line after it.
    pub fn header_for(&self, category: &Category) -> String {
        self.header.replace("{category}", &category.name)
    }
}

/// One multiple-choice question (options in choice order).
#[derive(Debug, Clone)]
pub struct Question {
    pub question: String,
    pub options: Vec<String>,
    pub answer: Option<String>,
}

/// Rendering switches (spec §6 P1).
#[derive(Debug, Clone, Copy, Default)]
pub struct Render {
    /// `.strip()` the question as lm-eval's ceval/cmmlu YAMLs do (default: keep it).
    pub strip_question: bool,
}

impl Format {
    /// `question\nA. ..\nB. ..\nC. ..\nD. ..\n答案：` (+ `answer\n\n` for an exemplar).
    pub fn block(&self, q: &Question, with_answer: bool, r: Render) -> String {
        let mut s = if r.strip_question { q.question.trim().to_string() } else { q.question.clone() };
        for (letter, option) in self.choices.iter().zip(&q.options) {
            s.push('\n');
            s.push_str(letter);
            s.push_str(". ");
            s.push_str(option);
        }
        s.push('\n');
        s.push_str(&self.answer_cue);
        if with_answer {
            s.push_str(q.answer.as_deref().unwrap_or_default());
            s.push_str("\n\n");
        }
        s
    }

    /// The single-message prompt: header, blank line, the exemplars with answers, the question.
    pub fn prompt(&self, category: &Category, shots: &[Question], test: &Question, r: Render) -> String {
        let mut s = self.header_for(category);
        s.push_str("\n\n");
        for shot in shots {
            s.push_str(&self.block(shot, true, r));
        }
        s.push_str(&self.block(test, false, r));
        s
    }

    /// C-Eval's chat layout: a system message (prefix + header), each exemplar as a user
    /// turn and its answer as the assistant turn, the question last; the header and a blank
    /// line also open the first user turn.
    pub fn ceval_messages(&self, category: &Category, shots: &[Question], test: &Question, r: Render) -> Vec<Message> {
        let header = self.header_for(category);
        let mut out = vec![Message::new(Role::System, format!("{}{header}", self.ceval_system_prefix))];
        for shot in shots {
            out.push(Message::new(Role::User, self.block(shot, false, r)));
            out.push(Message::new(Role::Assistant, shot.answer.clone().unwrap_or_default()));
        }
        out.push(Message::new(Role::User, self.block(test, false, r)));
        out[1].content = format!("{header}\n\n{}", out[1].content);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn zh() -> Format {
        let root = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.."));
        Format::read(&root.join("pipelines/prompts/roleeval/zh.json")).unwrap()
    }

    fn q(question: &str, opts: [&str; 4], answer: Option<&str>) -> Question {
        Question {
            question: question.into(),
            options: opts.iter().map(|s| s.to_string()).collect(),
            answer: answer.map(str::to_string),
        }
    }

    #[test]
    fn layout_byte_for_byte() {
        let f = zh();
        let cat = f.category("celebrities").unwrap();
        let shot = q("莫言和管笑笑是什么关系？", ["上下级关系", "同学关系", "父女关系", "兄妹关系"], Some("C"));
        let test = q("Q？", ["1985", " 约翰内斯堡", "c", "d"], None);
        let p = f.prompt(cat, std::slice::from_ref(&shot), &test, Render::default());
        assert_eq!(
            p,
            "以下是关于名人的单项选择题，请选出其中的正确答案。\n\n莫言和管笑笑是什么关系？\nA. 上下级关系\nB. 同学关系\nC. 父女关系\nD. 兄妹关系\n答案：C\n\nQ？\nA. 1985\nB.  约翰内斯堡\nC. c\nD. d\n答案："
        );
        let zero = f.prompt(cat, &[], &test, Render::default());
        assert!(zero.starts_with("以下是关于名人的单项选择题，请选出其中的正确答案。\n\nQ？\nA. 1985"));
        let stripped = f.prompt(cat, &[], &q(" Q？\n", ["a", "b", "c", "d"], None), Render { strip_question: true });
        assert!(stripped.contains("\n\nQ？\nA. a"));
        let m = f.ceval_messages(cat, std::slice::from_ref(&shot), &test, Render::default());
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].content, "你是一个中文人工智能助手，以下是关于名人的单项选择题，请选出其中的正确答案。");
        assert!(m[1].content.starts_with("以下是关于名人的单项选择题，请选出其中的正确答案。\n\n莫言和管笑笑"));
        assert!(m[1].content.ends_with("\n答案："));
        assert_eq!((m[2].role, m[2].content.as_str()), (Role::Assistant, "C"));
        assert!(m[3].content.starts_with("Q？\nA. 1985"));
    }
}
