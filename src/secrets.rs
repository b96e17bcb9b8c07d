//! Secret values (API keys read from the environment) known to this process, and
//! scrubbing of any text before it reaches a log line, an error message, a failure
//! table, a cache or the manifest.

use std::sync::RwLock;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Remember a secret so every later `scrub` removes it. Short values are ignored
/// (they would mangle ordinary text and are not plausible keys).
pub fn register(secret: &str) {
    let secret = secret.trim();
    if secret.len() < 8 {
        return;
    }
    let mut all = SECRETS.write().expect("secrets");
    if !all.iter().any(|s| s == secret) {
        all.push(secret.to_string());
    }
}

/// Whether an environment variable's name says it holds a secret (`WANDB_API_KEY`,
/// `HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`, `DB_PASSWORD`...).
pub fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    ["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL"].iter().any(|w| name.contains(w))
}

/// Register the values of the variables whose names say they are secrets.
pub fn register_env<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) {
    for (name, value) in vars {
        if is_secret_name(name) {
            register(value);
        }
    }
}

/// Replace every registered secret and every secret-looking token with `***`.
pub fn scrub(text: &str) -> String {
    let mut out = text.to_string();
    for s in SECRETS.read().expect("secrets").iter() {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "***");
        }
    }
    crate::store::state::redact_text(&out)
}

/// Read an API key from an environment variable and register it.
pub fn key_from_env(var: &str) -> Option<String> {
    let key = std::env::var(var).ok().filter(|k| !k.trim().is_empty())?;
    register(&key);
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_secrets_are_scrubbed() {
        register("my-very-secret-key-123");
        assert_eq!(scrub("auth failed for my-very-secret-key-123!"), "auth failed for ***!");
        register("short");
        assert_eq!(scrub("a short text"), "a short text");
    }

    #[test]
    fn secret_names_register_their_values() {
        assert!(is_secret_name("WANDB_API_KEY") && is_secret_name("hf_token") && is_secret_name("DB_PASSWORD"));
        assert!(!is_secret_name("CUDA_VISIBLE_DEVICES") && !is_secret_name("PATH"));
        register_env([("HF_TOKEN", "a-token-value-42"), ("HOME", "/home/someone-long")]);
        assert_eq!(scrub("a-token-value-42 in /home/someone-long"), "*** in /home/someone-long");
    }
}
