//! SHA-256 of a byte string, lower-case hex (the `sha2` crate): RoleEval's prompts are
//! checked against reference renderings by their SHA-256 (the spec's §3.1 table), and
//! every rendered prompt carries its digest (`prompt_sha256`) so renderings can be
//! compared with other tools (`sha256sum`, Python's hashlib) byte for byte.

use sha2::{Digest, Sha256};

/// The digest of `data` as 64 lower-case hex digits.
pub fn hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::hex;

    #[test]
    fn known_digests() {
        assert_eq!(hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
