//! A local model's own chat template: the Jinja template in its GGUF metadata
//! (`tokenizer.chat_template`) rendered with minijinja as transformers renders it
//! (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception`), or,
//! for a template minijinja cannot render, llama.cpp's built-in formats it recognises.

use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};

use synth_llm::Message;

pub struct ChatTemplate {
    /// The Jinja source from the GGUF, when there is one.
    source: Option<String>,
    /// The beginning-of-sequence token's text.
    pub bos: String,
    eos: String,
}

impl ChatTemplate {
    pub fn from_model(model: &LlamaModel) -> ChatTemplate {
        let source = model.meta_val_str("tokenizer.chat_template").ok().filter(|s| !s.trim().is_empty());
        let vocab = model.vocab();
        let piece = |t| String::from_utf8_lossy(&vocab.token_to_piece(t, true, None)).into_owned();
        ChatTemplate { source, bos: piece(vocab.bos()), eos: piece(vocab.eos()) }
    }

    /// The prompt of a conversation, ending where the assistant's answer starts.
    pub fn render(&self, model: &LlamaModel, messages: &[Message]) -> Result<String, String> {
        let jinja_error = match &self.source {
            Some(source) => match self.jinja(source, messages) {
                Ok(prompt) => return Ok(prompt),
                Err(e) => Some(e),
            },
            None => None,
        };
        // llama.cpp's own formats (it recognises the common templates by their markers).
        let builtin = model.chat_template(None).map_err(|e| e.to_string()).and_then(|t| {
            let chat = messages
                .iter()
                .map(|m| LlamaChatMessage::new(m.role.as_str().to_string(), m.content.clone()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            model.apply_chat_template(&t, &chat, true).map_err(|e| e.to_string())
        });
        builtin.map_err(|e| match jinja_error {
            Some(j) => format!("the model's chat template does not render ({j}), nor does llama.cpp's ({e})"),
            None => format!("the model has no chat template and llama.cpp has none for it ({e})"),
        })
    }

    fn jinja(&self, source: &str, messages: &[Message]) -> Result<String, String> {
        let mut env = minijinja::Environment::new();
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        let messages: Vec<serde_json::Value> =
            messages.iter().map(|m| serde_json::json!({"role": m.role.as_str(), "content": m.content})).collect();
        let ctx = minijinja::context! {
            messages => minijinja::Value::from(minijinja::value::Serde(&messages)),
            add_generation_prompt => true,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        };
        env.render_str(source, ctx).map_err(|e| e.to_string())
    }
}
