//! Prices per million tokens, for cost accounting. Defaults cover common OpenAI and
//! Anthropic models (online list prices when this table was written; batch calls cost
//! these times the provider's `batch_price_factor`); a provider's
//! `price_input_per_mtok` / `price_output_per_mtok` override them. Unknown models
//! cost 0 (reported once as a warning).

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input: f64,
    pub output: f64,
}

const DEFAULTS: &[(&str, f64, f64)] = &[
    ("gpt-4o-mini", 0.15, 0.60),
    ("gpt-4o", 2.50, 10.00),
    ("gpt-4.1-nano", 0.10, 0.40),
    ("gpt-4.1-mini", 0.40, 1.60),
    ("gpt-4.1", 2.00, 8.00),
    ("gpt-4-turbo", 10.00, 30.00),
    ("gpt-4", 30.00, 60.00),
    ("gpt-3.5-turbo", 0.50, 1.50),
    ("o1-mini", 1.10, 4.40),
    ("o1", 15.00, 60.00),
    ("o3-mini", 1.10, 4.40),
    ("o4-mini", 1.10, 4.40),
    ("text-embedding-3-small", 0.02, 0.0),
    ("text-embedding-3-large", 0.13, 0.0),
    ("text-embedding-ada-002", 0.10, 0.0),
    ("claude-3-haiku", 0.25, 1.25),
    ("claude-3-5-haiku", 0.80, 4.00),
    ("claude-3-5-sonnet", 3.00, 15.00),
    ("claude-3-7-sonnet", 3.00, 15.00),
    ("claude-3-opus", 15.00, 75.00),
    ("claude-sonnet-4", 3.00, 15.00),
    ("claude-opus-4", 15.00, 75.00),
    ("claude-opus-4-5", 5.00, 25.00),
    ("claude-haiku-4-5", 1.00, 5.00),
    ("gpt-5", 1.25, 10.00),
    ("gpt-5-mini", 0.25, 2.00),
    ("gpt-5-nano", 0.05, 0.40),
];

/// The default price of a model: exact name, else the longest known prefix
/// (`gpt-4o-2024-08-06` is priced as `gpt-4o`, `gpt-4o-mini-...` as `gpt-4o-mini`).
pub fn default_price(model: &str) -> Option<Price> {
    let model = model.rsplit('/').next().unwrap_or(model);
    DEFAULTS
        .iter()
        .filter(|(name, _, _)| model == *name || model.starts_with(&format!("{name}-")))
        .max_by_key(|(name, _, _)| name.len())
        .map(|(_, i, o)| Price { input: *i, output: *o })
}

impl Price {
    pub fn cost(&self, tokens_in: u64, tokens_out: u64) -> f64 {
        (tokens_in as f64 * self.input + tokens_out as f64 * self.output) / 1e6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_by_longest_prefix() {
        assert_eq!(default_price("gpt-4o").unwrap().input, 2.50);
        assert_eq!(default_price("gpt-4o-2024-08-06").unwrap().input, 2.50);
        assert_eq!(default_price("gpt-4o-mini-2024-07-18").unwrap().input, 0.15);
        assert_eq!(default_price("openai/gpt-4-turbo").unwrap().output, 30.0);
        assert!(default_price("llama-3.1-8b").is_none());
        let p = default_price("gpt-4o").unwrap();
        assert!((p.cost(1_000_000, 100_000) - 3.5).abs() < 1e-9);
    }
}
