//! Chat vocabulary that crosses module and output boundaries: the message [`Role`] with
//! its spellings — lower case for OpenAI-compatible APIs and TRL (`system`, `user`,
//! `assistant`), capitalised in role-play releases' layouts (`System`, `User`,
//! `Assistant`), and the aliases other datasets use (ShareGPT's `human` / `gpt`, ...).

use serde::{Deserialize, Serialize};

/// Who speaks a message. Serialized in lower case (`"user"`), as chat APIs spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    /// `system`, `user` or `assistant`, in any case.
    pub fn parse(s: &str) -> Option<Role> {
        match s.to_ascii_lowercase().as_str() {
            "system" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            _ => None,
        }
    }

    /// [`Role::parse`] plus the aliases of other chat datasets: `human` / `prompter`
    /// (user), `gpt` / `bot` / `model` / `chatbot` (assistant).
    pub fn parse_loose(s: &str) -> Option<Role> {
        Role::parse(s).or_else(|| match s.to_ascii_lowercase().as_str() {
            "human" | "prompter" => Some(Role::User),
            "gpt" | "bot" | "model" | "chatbot" => Some(Role::Assistant),
            _ => None,
        })
    }

    /// The API / TRL spelling: `system`, `user`, `assistant`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }

    /// The capitalised spelling of role-play releases: `System`, `User`, `Assistant`.
    pub fn official(self) -> &'static str {
        match self {
            Role::System => "System",
            Role::User => "User",
            Role::Assistant => "Assistant",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings() {
        assert_eq!(Role::parse("User"), Some(Role::User));
        assert_eq!(Role::parse("gpt"), None);
        assert_eq!(Role::parse_loose("gpt"), Some(Role::Assistant));
        assert_eq!(Role::parse_loose("Human"), Some(Role::User));
        assert_eq!(Role::parse_loose("tool"), None);
        assert_eq!(serde_json::to_string(&Role::Assistant).unwrap(), "\"assistant\"");
        assert_eq!(Role::System.official(), "System");
    }
}
