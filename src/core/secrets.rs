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
    // Copied once when nothing is found (this runs on every stored request).
    let mut out: Option<String> = None;
    for s in SECRETS.read().expect("secrets").iter() {
        let now = out.as_deref().unwrap_or(text);
        if now.contains(s.as_str()) {
            out = Some(now.replace(s.as_str(), "***"));
        }
    }
    redact_text(out.as_deref().unwrap_or(text))
}

/// [`scrub`] of an owned text: a clean one (the usual case) comes back as it is, without
/// a copy.
pub fn scrub_owned(text: String) -> String {
    let registered = SECRETS.read().expect("secrets").iter().any(|s| text.contains(s.as_str()));
    if registered || text.contains("sk-") || text.contains("hf_") || mentions_bearer(&text) {
        scrub(&text)
    } else {
        text
    }
}

/// Whether `s` holds "bearer" in any ASCII case (without a lower-cased copy).
fn mentions_bearer(s: &str) -> bool {
    let b = s.as_bytes();
    memchr::memchr2_iter(b'b', b'B', b).any(|i| b.get(i..i + 6).is_some_and(|w| w.eq_ignore_ascii_case(b"bearer")))
}

/// Read an API key from an environment variable and register it.
pub fn key_from_env(var: &str) -> Option<String> {
    let key = std::env::var(var).ok().filter(|k| !k.trim().is_empty())?;
    register(&key);
    Some(key)
}

/// Whether a config key names a secret value.
fn is_secret_key(key: &str) -> bool {
    let k = key.to_lowercase();
    if k.ends_with("_env") || k.ends_with("_var") {
        return false; // names an environment variable, holds no secret
    }
    k == "token"
        || k.ends_with("_token")
        || k == "authorization"
        || ["api_key", "apikey", "secret", "password", "bearer"].iter().any(|m| k.contains(m))
}

/// Replace values that are, or look like, secrets with `"***"`. Keys that only *name*
/// an environment variable (`api_key_env`) are kept: they hold no secret.
pub fn redact(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        J::Object(map) => J::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if is_secret_key(k) && !v.is_null() && !v.is_boolean() && !v.is_number() {
                        J::String("***".into())
                    } else {
                        redact(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        J::Array(items) => J::Array(items.iter().map(redact).collect()),
        J::String(s) => J::String(redact_text(s)),
        other => other.clone(),
    }
}

/// Replace secret-looking tokens inside free text (`sk-...`, `hf_...`, `Bearer x`).
pub fn redact_text(s: &str) -> String {
    if !s.contains("sk-") && !s.contains("hf_") && !mentions_bearer(s) {
        return s.to_string();
    }
    // Words are runs of the characters a key or a bearer token is made of (RFC 6750's
    // b64token: letters, digits, `-._~+/` and trailing `=`); everything between them is kept
    // as it is. A word after `bearer` and spaces, or shaped like a key, becomes `***`: a
    // token ends where its characters end, so a line break, a quote or the next JSON record
    // after it is never taken with it.
    // `=` only at a word's end (padding): `key=sk-…` is two words.
    let token_char = |b: u8| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b);
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let (mut i, mut kept) = (0, 0);
    // The last word was `bearer`, and only spaces or tabs have followed it.
    let mut after_bearer = false;
    while i < b.len() {
        if !token_char(b[i]) {
            if b[i] != b' ' && b[i] != b'\t' {
                after_bearer = false;
            }
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && token_char(b[i]) {
            i += 1;
        }
        let pad = b[i..].iter().take_while(|&&c| c == b'=').count();
        if pad > 0 && b.get(i + pad).is_none_or(|&c| !token_char(c)) {
            i += pad;
        }
        let word = &s[start..i];
        let secret = after_bearer || looks_like_secret(word);
        if secret {
            out.push_str(&s[kept..start]);
            out.push_str("***");
            kept = i;
        }
        after_bearer = !secret && word.eq_ignore_ascii_case("bearer");
    }
    out.push_str(&s[kept..]);
    out
}

/// Common API key shapes (OpenAI `sk-`, Hugging Face `hf_`, bearer tokens).
pub fn looks_like_secret(s: &str) -> bool {
    let s = s.trim();
    if s.to_lowercase().starts_with("bearer ") {
        return true;
    }
    (s.starts_with("sk-") || s.starts_with("hf_")) && s.len() >= 12 && !s.contains(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn redaction() {
        let v = json!({"providers": {"gpt": {"api_key_env": "OPENAI_API_KEY", "api_key": "abc", "model": "gpt-4o",
            "headers": {"Authorization": "Bearer x"}, "note": "sk-abcdefghijklmnop"}}});
        let r = redact(&v);
        assert_eq!(r["providers"]["gpt"]["api_key_env"], "OPENAI_API_KEY");
        assert_eq!(r["providers"]["gpt"]["api_key"], "***");
        assert_eq!(r["providers"]["gpt"]["model"], "gpt-4o");
        assert_eq!(r["providers"]["gpt"]["headers"]["Authorization"], "***");
        assert_eq!(r["providers"]["gpt"]["note"], "***");
        assert_eq!(redact_text("key sk-abcdefghijklmnop here"), "key *** here");
        assert_eq!(redact_text("Authorization: Bearer abc"), "Authorization: Bearer ***");
        assert_eq!(redact_text("auth: BEARER abc"), "auth: BEARER ***");
        assert_eq!(redact_text("a bear, a beare, abearer! b"), "a bear, a beare, abearer! b");
        // A token ends with its characters: the next line, quote or record stays.
        assert_eq!(
            redact_text("{\"h\": \"Bearer abc.def\"}\n{\"id\": \"r2\", \"text\": \"kept\"}"),
            "{\"h\": \"Bearer ***\"}\n{\"id\": \"r2\", \"text\": \"kept\"}"
        );
        assert_eq!(redact_text("Bearer\nnext line"), "Bearer\nnext line", "a token is on its line");
        assert_eq!(redact_text("Bearer dGVzdA== rest"), "Bearer *** rest");
        assert_eq!(redact_text("key=sk-abcdefghijklmnop\n{\"id\": 2}"), "key=***\n{\"id\": 2}");
        assert_eq!(redact_text("bearer: x"), "bearer: x", "a colon after bearer is no token");
        assert!(mentions_bearer("x bEaReR") && !mentions_bearer("bearebearb") && !mentions_bearer("b"));
    }

    #[test]
    fn registered_secrets_are_scrubbed() {
        register("my-very-secret-key-123");
        assert_eq!(scrub("auth failed for my-very-secret-key-123!"), "auth failed for ***!");
        register("short");
        assert_eq!(scrub("a short text"), "a short text");
    }

    #[test]
    fn an_owned_clean_text_is_not_copied_and_a_dirty_one_is_scrubbed() {
        register("owned-secret-value-77");
        let clean = String::from("{\"messages\":[{\"content\":\"hello\"}]}");
        let at = clean.as_ptr();
        let out = scrub_owned(clean);
        assert_eq!(out.as_ptr(), at, "a clean text came back as a copy");
        assert_eq!(scrub_owned("key owned-secret-value-77 here".into()), "key *** here");
        assert_eq!(scrub_owned("Bearer abc".into()), scrub("Bearer abc"));
        assert_eq!(scrub_owned("sk-abcdefghijklmnop".into()), "***");
    }

    #[test]
    fn secret_names_register_their_values() {
        assert!(is_secret_name("WANDB_API_KEY") && is_secret_name("hf_token") && is_secret_name("DB_PASSWORD"));
        assert!(!is_secret_name("CUDA_VISIBLE_DEVICES") && !is_secret_name("PATH"));
        register_env([("HF_TOKEN", "a-token-value-42"), ("HOME", "/home/someone-long")]);
        assert_eq!(scrub("a-token-value-42 in /home/someone-long"), "*** in /home/someone-long");
    }
}
