//! RoleEval's answer extraction for generated text (spec §3.3): C-Eval's
//! `extract_ans`, then CMMLU's `extract_choice`, then no answer — each with the
//! semantics of the Python originals (first character wins; C-Eval takes the last
//! `findall` match of the first pattern that matches; CMMLU searches in multi-line
//! mode, its recursive rules search again inside the match). The patterns are data
//! (`rules/roleeval/ceval.txt`, `rules/roleeval/cmmlu.tsv`); which one fired is
//! returned with the letter.

use std::sync::LazyLock;

use regex::Regex;

const CEVAL: &str = include_str!("../../../rules/roleeval/ceval.txt");
const CMMLU: &str = include_str!("../../../rules/roleeval/cmmlu.tsv");

/// One step of CMMLU's cascade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Single,
    Recursive,
    Weak,
    Only,
}

struct Rule {
    step: Step,
    group: usize,
    source: String,
    re: Regex,
}

/// The compiled rule lists (the files are checked by the unit tests).
struct Rules {
    ceval: Vec<(String, Regex)>,
    cmmlu: Vec<Rule>,
}

fn load() -> Result<Rules, String> {
    let lines = |text: &'static str| {
        text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#')).map(|(i, l)| (i + 1, l))
    };
    let mut ceval = Vec::new();
    for (n, line) in lines(CEVAL) {
        let re = Regex::new(line).map_err(|e| format!("rules/roleeval/ceval.txt:{n}: {e}"))?;
        ceval.push((line.to_string(), re));
    }
    let mut cmmlu = Vec::new();
    for (n, line) in lines(CMMLU) {
        let at = |m: String| format!("rules/roleeval/cmmlu.tsv:{n}: {m}");
        let mut parts = line.splitn(3, '\t');
        let (Some(step), Some(group), Some(pattern)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(at("expected step, group and pattern separated by tabs".into()));
        };
        let step = match step {
            "single" => Step::Single,
            "recursive" => Step::Recursive,
            "weak" => Step::Weak,
            "only" => Step::Only,
            other => return Err(at(format!("unknown step \"{other}\""))),
        };
        let group: usize = group.parse().map_err(|_| at(format!("bad group \"{group}\"")))?;
        // CMMLU searches with re.M except for the `only` rule (re.match, anchored by the pattern).
        let full = if step == Step::Only { pattern.to_string() } else { format!("(?m){pattern}") };
        let re = Regex::new(&full).map_err(|e| at(e.to_string()))?;
        if group == 0 || group >= re.captures_len() {
            return Err(at(format!("group {group} does not exist")));
        }
        cmmlu.push(Rule { step, group, source: pattern.to_string(), re });
    }
    Ok(Rules { ceval, cmmlu })
}

static RULES: LazyLock<Rules> = LazyLock::new(|| load().expect("the rule files are checked by the unit tests"));

/// Which rule lists run, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Ceval,
    Cmmlu,
}

impl List {
    pub fn parse(s: &str) -> Option<List> {
        match s {
            "ceval" => Some(List::Ceval),
            "cmmlu" => Some(List::Cmmlu),
            _ => None,
        }
    }
}

const LETTERS: [char; 4] = ['A', 'B', 'C', 'D'];

/// Python's `str.strip()` (Unicode whitespace).
fn py_strip(s: &str) -> &str {
    s.trim_matches(char::is_whitespace)
}

/// C-Eval's `extract_ans` on `response.strip()`: (letter, rule).
pub fn ceval(response: &str) -> Option<(char, String)> {
    let s = py_strip(response);
    let first = s.chars().next()?;
    if LETTERS.contains(&first) {
        return Some((first, "ceval:first_char".into()));
    }
    for (source, re) in &RULES.ceval {
        // re.findall with one group: every non-overlapping match's group; the caller takes the last.
        if let Some(last) = re.captures_iter(s).filter_map(|c| c.get(1)).last() {
            let letter = last.as_str().chars().next()?;
            return Some((letter, format!("ceval:{source}")));
        }
    }
    None
}

/// CMMLU's `extract_choice` without its random fallback: (letter, rule).
pub fn cmmlu(response: &str) -> Option<(char, String)> {
    let first = response.chars().next()?;
    if LETTERS.contains(&first) {
        return Some((first, "cmmlu:first_char".into()));
    }
    let letter = |m: regex::Match<'_>| m.as_str().chars().next();
    let found = |rule: &Rule, letter: char| Some((letter, format!("cmmlu:{}", rule.source)));
    for step in [Step::Single, Step::Recursive, Step::Weak, Step::Only] {
        for rule in RULES.cmmlu.iter().filter(|r| r.step == step) {
            match step {
                Step::Single | Step::Weak | Step::Only => {
                    if let Some(c) = rule.re.captures(response)
                        && let Some(l) = c.get(rule.group).and_then(letter)
                    {
                        return found(rule, l);
                    }
                }
                Step::Recursive => {
                    // m = re.search(p, response); while m: answer = m.group(1); m = re.search(p, m.group(0)[1:])
                    let mut answer = None;
                    let mut hay: String = response.to_string();
                    while let Some(c) = rule.re.captures(&hay) {
                        answer = c.get(rule.group).and_then(letter).or(answer);
                        let whole = c.get(0).expect("group 0").as_str();
                        let mut chars = whole.chars();
                        chars.next();
                        let next = chars.as_str().to_string();
                        if next.len() >= hay.len() {
                            break;
                        }
                        hay = next;
                    }
                    if let Some(l) = answer {
                        return found(rule, l);
                    }
                }
            }
        }
    }
    None
}

/// The cascade: each list in order; then, with `random_seed`, CMMLU's random guess
/// (seeded, unlike the original); else no answer.
pub fn extract(response: &str, lists: &[List], random_seed: Option<u64>) -> Option<(char, String)> {
    for list in lists {
        let got = match list {
            List::Ceval => ceval(response),
            List::Cmmlu => cmmlu(response),
        };
        if got.is_some() {
            return got;
        }
    }
    random_seed.map(|seed| (LETTERS[(seed % 4) as usize], "cmmlu:random".to_string()))
}

/// Check the rule files (for the parser's build: a broken file is a clear error).
pub fn check_rules() -> Result<(), String> {
    load().map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: &[List] = &[List::Ceval, List::Cmmlu];

    #[test]
    fn rule_files_compile() {
        check_rules().unwrap();
        assert_eq!(RULES.ceval.len(), 17);
        assert_eq!(RULES.cmmlu.len(), 16);
    }

    /// Raw response, C-Eval's letter, CMMLU's (letter, rule), the cascade's letter.
    type Case = (&'static str, Option<char>, Option<(char, String)>, Option<char>);

    /// The spec's §3.3 table: C-Eval, CMMLU (rule), default cascade.
    #[test]
    fn the_thirteen_worked_cases() {
        let p = |s: &str| s.to_string();
        #[rustfmt::skip]
        let cases: &[Case] = &[
            ("C", Some('C'), Some(('C', p("cmmlu:first_char"))), Some('C')),
            ("答案：B", Some('B'), Some(('B', p("cmmlu:答案?：?([ABCD])"))), Some('B')),
            ("根据我的知识，正确答案是 D。", Some('D'), Some(('D', p("cmmlu:答案(选项)?(是|为)：? ?([ABCD])"))), Some('D')),
            ("选项A是正确的，因为她在1985年考入。", Some('A'), Some(('A', p("cmmlu:选项 ?([ABCD]) ?(是|为)?正确"))), Some('A')),
            ("C. 建成了凯悦酒店", Some('C'), Some(('C', p("cmmlu:first_char"))), Some('C')),
            ("我认为应该选B", None, Some(('B', p("cmmlu:故?选择?：? ?([ABCD])"))), Some('B')),
            ("The answer is A.", None, Some(('A', p("cmmlu:^[^ABCD]*([ABCD])[^ABCD]*$"))), Some('A')),
            ("A和B都不对，正确的是C", Some('A'), Some(('A', p("cmmlu:first_char"))), Some('A')),
            ("我不确定。", None, None, None),
            ("答案：\n\nD", Some('D'), Some(('D', p("cmmlu:^[^ABCD]*([ABCD])[^ABCD]*$"))), Some('D')),
            ("正确答案为：C。", Some('C'), Some(('C', p("cmmlu:答案(选项)?(是|为)：? ?([ABCD])"))), Some('C')),
            ("  B\n", Some('B'), None, Some('B')),
            ("所以D选项正确，A选项错误，B选项正确", None, Some(('D', p("cmmlu:([ABCD]) ?选?项(是|为)?正确"))), Some('D')),
        ];
        for (i, (raw, want_ceval, want_cmmlu, want)) in cases.iter().enumerate() {
            let n = i + 1;
            assert_eq!(ceval(raw).map(|x| x.0), *want_ceval, "case {n} C-Eval: {raw:?}");
            if n != 12 {
                assert_eq!(cmmlu(raw), *want_cmmlu, "case {n} CMMLU: {raw:?}");
            }
            assert_eq!(extract(raw, BOTH, None).map(|x| x.0), *want, "case {n} cascade: {raw:?}");
        }
        // Case 12: CMMLU reads the unstripped text; its only-mentioned rule finds the B.
        assert_eq!(cmmlu("  B\n").map(|x| x.0), Some('B'));
        // Which rule of the cascade fired.
        assert_eq!(extract("答案：B", BOTH, None).unwrap().1, "ceval:答案：\\s?选?项?\\s?([A-D])");
        assert_eq!(extract("我认为应该选B", BOTH, None).unwrap().1, "cmmlu:故?选择?：? ?([ABCD])");
        assert_eq!(extract("  B\n", BOTH, None).unwrap().1, "ceval:first_char");
    }

    #[test]
    fn findall_takes_the_last_match_and_random_fallback_is_seeded() {
        assert_eq!(ceval("解析：答案是A，不对，答案是C").map(|x| x.0), Some('C'));
        assert_eq!(ceval(""), None);
        assert_eq!(ceval("   "), None);
        assert_eq!(cmmlu(""), None);
        assert_eq!(extract("我不确定。", &[List::Ceval], Some(6)), Some(('C', "cmmlu:random".into())));
        assert_eq!(extract("我不确定。", &[List::Ceval], None), None);
        // Only C-Eval: its patterns do not see "选B" in the middle of a sentence.
        assert_eq!(extract("我认为应该选B", &[List::Ceval], None), None);
        // The recursive rule keeps searching inside its match: the last letter before 正确 wins.
        assert_eq!(cmmlu("我看A和C都正确").map(|x| x.0), Some('C'));
    }
}
