//! Deterministic randomness: every random choice derives from (pipeline seed,
//! stage name, record id, purpose), never from the order records arrive in or
//! from how many tasks ran concurrently.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A 64-bit key for (seed, stage, id, purpose).
pub fn record_key(seed: u64, stage: &str, id: &str, purpose: &str) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    for part in [stage, id, purpose] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let bytes = h.finalize();
    u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// A seeded generator for (seed, stage, id, purpose).
pub fn record_rng(seed: u64, stage: &str, id: &str, purpose: &str) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(record_key(seed, stage, id, purpose))
}

/// Map a key to [0, 1).
pub fn unit(key: u64) -> f64 {
    (key >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_every_part() {
        let base = record_key(1, "s", "a", "");
        assert_eq!(base, record_key(1, "s", "a", ""));
        assert_ne!(base, record_key(2, "s", "a", ""));
        assert_ne!(base, record_key(1, "t", "a", ""));
        assert_ne!(base, record_key(1, "s", "b", ""));
        assert_ne!(record_key(1, "ab", "c", ""), record_key(1, "a", "bc", ""));
        let u = unit(base);
        assert!((0.0..1.0).contains(&u));
    }
}
