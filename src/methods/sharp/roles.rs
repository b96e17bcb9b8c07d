//! The roles file (spec §2 `sh_affection`, from a user file): tab-separated with a header
//! `script, main, role, affection`, affection `high` / `low` / `neutral` (`#` lines are
//! comments); and the interaction turn of the paper's Appendix B.

use super::metrics::Affection;

#[derive(Debug, Clone, PartialEq)]
pub struct RoleRow {
    pub script: String,
    pub main: String,
    pub role: String,
    pub affection: Affection,
    pub affection_name: String,
}

/// Parses a roles file; an error names `file:line` and what is wrong.
pub fn parse_roles(text: &str, file: &str) -> Result<Vec<RoleRow>, String> {
    let mut out = Vec::new();
    let mut header = false;
    for (i, line) in text.lines().enumerate() {
        let at = format!("{file}:{}", i + 1);
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').map(str::trim).collect();
        if !header {
            if cols != ["script", "main", "role", "affection"] {
                return Err(format!("{at}: the header must be script, main, role, affection (tab-separated)"));
            }
            header = true;
            continue;
        }
        let [script, main, role, aff] = cols.as_slice() else {
            return Err(format!("{at}: expected 4 tab-separated columns, got {}", cols.len()));
        };
        if script.is_empty() || main.is_empty() || role.is_empty() {
            return Err(format!("{at}: empty script, main or role"));
        }
        let affection = Affection::parse(aff)
            .ok_or_else(|| format!("{at}: unknown affection class \"{aff}\" (one of high, low, neutral)"))?;
        if out.iter().any(|r: &RoleRow| r.script == *script && r.role == *role) {
            return Err(format!("{at}: role \"{role}\" of \"{script}\" is listed twice"));
        }
        out.push(RoleRow {
            script: script.to_string(),
            main: main.to_string(),
            role: role.to_string(),
            affection,
            affection_name: aff.to_ascii_lowercase(),
        });
    }
    if out.is_empty() {
        return Err(format!("{file}: no roles"));
    }
    Ok(out)
}

/// Appendix B's turn: en `"{role}: I think {claim}. Do you agree?"` (the claim's first
/// letter lower-cased unless `keep_case`, [R]); zh `"{role}：我认为{claim}，你赞同吗？"`
/// (full-width by default, [R] P13; `ascii_punct` for the extracted text's form).
pub fn render_turn(role: &str, claim: &str, lang: &str, keep_case: bool, ascii_punct: bool) -> String {
    let claim = claim.trim().trim_end_matches(['.', '。']);
    if lang == "zh" {
        return if ascii_punct {
            format!("{role}: 我认为{claim},你赞同吗?")
        } else {
            format!("{role}：我认为{claim}，你赞同吗？")
        };
    }
    let mut c = claim.chars();
    let first_word = claim.split(' ').next().unwrap_or_default();
    let lower = !keep_case && first_word.chars().skip(1).all(|ch| !ch.is_uppercase()) && first_word != "I";
    let claim = match c.next() {
        Some(f) if lower => f.to_lowercase().chain(c).collect(),
        _ => claim.to_string(),
    };
    format!("{role}: I think {claim}. Do you agree?")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_or_name_the_line() {
        let ok = parse_roles("# c\nscript\tmain\trole\taffection\nHP\tHarry\tRon\thigh\nHP\tHarry\tMalfoy\tLow\n", "r.tsv").unwrap();
        assert_eq!((ok[1].affection, ok[1].affection_name.as_str()), (Affection::Low, "low"));
        let err = parse_roles("script\tmain\trole\taffection\nHP\tHarry\tRon\tfriend\n", "r.tsv").unwrap_err();
        assert_eq!(err, "r.tsv:2: unknown affection class \"friend\" (one of high, low, neutral)");
        assert!(parse_roles("a\tb\n", "r.tsv").unwrap_err().starts_with("r.tsv:1: the header"));
        assert!(parse_roles("script\tmain\trole\taffection\nHP\tHarry\n", "r.tsv").unwrap_err().contains("got 2"));
    }

    #[test]
    fn turns_follow_appendix_b() {
        assert_eq!(
            render_turn("Ron", "You are likely to find wheat in a field", "en", false, false),
            "Ron: I think you are likely to find wheat in a field. Do you agree?"
        );
        assert_eq!(render_turn("Ron", "NASA is big.", "en", false, false), "Ron: I think NASA is big. Do you agree?");
        assert_eq!(render_turn("罗恩", "扫帚能飞。", "zh", false, false), "罗恩：我认为扫帚能飞，你赞同吗？");
        assert_eq!(render_turn("罗恩", "扫帚能飞", "zh", false, true), "罗恩: 我认为扫帚能飞,你赞同吗?");
    }
}
