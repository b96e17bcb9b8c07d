//! Text helpers of SHARP's claims: CJK detection, phrase search at word boundaries (English
//! phrases match whole words, Chinese ones anywhere), and Traditional → Simplified
//! conversion of Chinese claims through OpenCC's dictionaries (`ferrous-opencc`, a pure-Rust
//! OpenCC; spec §2 `sh_claim_render`: ConceptNet's Chinese edges are partly Traditional).

use std::sync::LazyLock;

use ferrous_opencc::OpenCC;
use ferrous_opencc::config::BuiltinConfig;

/// A CJK ideograph or CJK / full-width punctuation.
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x3000..=0x303F | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0xFF00..=0xFFEF)
}

/// A character that makes a word with its neighbours (a Latin letter or digit, not CJK).
fn wordy(c: char) -> bool {
    c.is_alphanumeric() && !is_cjk(c)
}

/// Byte offset of the first occurrence of `phrase` in `text` that is a whole word sequence:
/// where the phrase begins (ends) with a word character, the character before (after) it
/// must not be one. Chinese phrases therefore match anywhere.
pub fn find_phrase(text: &str, phrase: &str) -> Option<usize> {
    if phrase.is_empty() {
        return None;
    }
    let (first, last) = (phrase.chars().next()?, phrase.chars().next_back()?);
    text.match_indices(phrase).map(|(at, _)| at).find(|&at| {
        let before = text[..at].chars().next_back();
        let after = text[at + phrase.len()..].chars().next();
        !(wordy(first) && before.is_some_and(wordy) || wordy(last) && after.is_some_and(wordy))
    })
}

/// How Chinese claims are written (`sharp_claims` `zh_convert`).
pub const ZH_CONVERSIONS: &[&str] = &["t2s", "tw2s", "tw2sp", "hk2s", "none"];

fn opencc(config: BuiltinConfig) -> OpenCC {
    OpenCC::from_config(config).expect("ferrous-opencc's built-in configurations load")
}

static T2S: LazyLock<OpenCC> = LazyLock::new(|| opencc(BuiltinConfig::T2s));
static TW2S: LazyLock<OpenCC> = LazyLock::new(|| opencc(BuiltinConfig::Tw2s));
static TW2SP: LazyLock<OpenCC> = LazyLock::new(|| opencc(BuiltinConfig::Tw2sp));
static HK2S: LazyLock<OpenCC> = LazyLock::new(|| opencc(BuiltinConfig::Hk2s));

/// `text` converted by one of [`ZH_CONVERSIONS`] (OpenCC's configurations of those names:
/// `t2s` Traditional → Simplified, `tw2s` / `hk2s` from the Taiwan / Hong Kong standards,
/// `tw2sp` with Taiwan phrases as well); `none` keeps it.
pub fn zh_convert(text: &str, conversion: &str) -> String {
    match conversion {
        "t2s" => T2S.convert(text),
        "tw2s" => TW2S.convert(text),
        "tw2sp" => TW2SP.convert(text),
        "hk2s" => HK2S.convert(text),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phrases_match_whole_words_in_english_anywhere_in_chinese() {
        assert_eq!(find_phrase("this is it", "is"), Some(5), "not inside \"this\"");
        assert_eq!(find_phrase("island", "is"), None);
        assert_eq!(find_phrase("a cat is a type of animal", "is a type of"), Some(6));
        assert_eq!(find_phrase("经理来访可能代表检查。", "可能代表"), Some(12));
        assert_eq!(find_phrase("社会", "会"), Some(3), "Chinese phrases match inside words");
    }

    #[test]
    fn traditional_becomes_simplified() {
        assert_eq!(zh_convert("經理來訪可能代表檢查。", "t2s"), "经理来访可能代表检查。");
        assert_eq!(zh_convert("走到飲水機的時候可能會用到檢查。", "t2s"), "走到饮水机的时候可能会用到检查。");
        assert_eq!(zh_convert("檢查", "none"), "檢查");
        assert_eq!(zh_convert("軟體", "tw2sp"), "软件", "Taiwan phrases");
    }
}
