//! Offline stand-ins for RoleMRC's parsers (`profile`, `dialogue`, `stylized`): a
//! 7-section role profile with narrated speech examples, a 10–15 line `**User**:` /
//! `**Name**:` dialogue, a stylized answer with an optional narration in parentheses
//! (a ruled rewrite applies the Figure 10 rule roughly). Built from the prompt's own
//! content by the generic offline provider's helpers; placeholder text of the right
//! shape, not training data.

use rand::seq::SliceRandom;
use rand::{Rng, RngExt};

use synth_llm::offline::{OfflineShape, between, block_after, content_words, paragraph, pick, pick_word, title};

/// The shapes of [`super::parsers`], registered through the method.
pub static SHAPES: &[&OfflineShape] = &[&PROFILE, &DIALOGUE, &STYLIZED];

pub static PROFILE: OfflineShape = OfflineShape { name: "profile", generate: |i, rng| profile(i.prompt, rng) };
pub static DIALOGUE: OfflineShape = OfflineShape { name: "dialogue", generate: |i, rng| dialogue(i.prompt, rng) };
pub static STYLIZED: OfflineShape = OfflineShape { name: "stylized", generate: |i, rng| stylized(i.prompt, rng) };

const FIRST: &[&str] = &[
    "Amara", "Bastian", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonah", "Kalani", "Lucia",
    "Mateo", "Nadia", "Oren", "Priya", "Quentin", "Rosa", "Soren", "Tamsin", "Uma", "Viktor", "Wren", "Ximena",
    "Yusuf", "Zora", "Evan", "Thorin", "Jessica", "Aiden",
];
const LAST: &[&str] = &[
    "Ashgrove",
    "Brightwater",
    "Calloway",
    "Delacroix",
    "Everhart",
    "Fairweather",
    "Goldleaf",
    "Hollowell",
    "Ironwood",
    "Jansen",
    "Kestrel",
    "Lindqvist",
    "Marlowe",
    "Northcott",
    "Okafor",
    "Pennington",
    "Quill",
    "Ravensworth",
    "Stonebridge",
    "Thornbury",
];
const TRAITS: &[(&str, &str)] = &[
    ("Curious", "always asking one more question before drawing a conclusion"),
    ("Patient", "willing to explain things twice, and a third time with a drawing"),
    ("Meticulous", "keeps careful notes and double-checks every detail"),
    ("Warm", "makes newcomers feel at home within minutes"),
    ("Stubborn", "rarely lets go of a problem before it is solved"),
    ("Playful", "slips a joke into even the most serious explanation"),
    ("Resilient", "treats setbacks as material for the next attempt"),
    ("Candid", "says plainly what they know and what they do not"),
];
const STYLES: &[&str] = &[
    "warm and unhurried",
    "brisk and precise",
    "playful and vivid",
    "calm and measured",
    "enthusiastic and expressive",
];
const HABITS: &[&str] = &[
    "using homely metaphors",
    "ending advice with a short question",
    "counting points off on their fingers",
    "referring to old notebooks",
    "pausing to sketch ideas in the air",
];
const GESTURES: &[&str] = &[
    "leans forward with a thoughtful frown",
    "smiles and taps the table twice",
    "glances at an old notebook",
    "rubs their chin, eyes narrowing",
    "gestures broadly toward the window",
    "laughs softly and shakes their head",
    "pauses, then nods slowly",
];
/// Skills a stand-in profile adds when its persona has fewer words than skills.
const CRAFTS: &[&str] = &["storytelling", "planning", "teaching", "listening", "sketching"];
const FAR_TOPICS: &[&str] =
    &["quantum chemistry", "tax law", "neurosurgery", "aircraft engineering", "maritime law", "astrophysics"];
/// The role name from a standardized profile (the line after the first heading).
pub fn role_name_in(text: &str) -> Option<String> {
    let after = text.split("####Role Name and Brief Description").nth(1)?;
    let line = after.lines().map(str::trim).find(|l| !l.is_empty())?;
    let name = line.split([',', '(']).next()?.trim().trim_matches('*').trim();
    (!name.is_empty()).then(|| name.to_string())
}

fn profile<R: Rng>(prompt: &str, rng: &mut R) -> String {
    let persona = between(prompt, "[The task role-play setting entered by the user]", "[The rewritten")
        .filter(|p| !p.is_empty() && !p.contains("{persona}"))
        .unwrap_or_else(|| prompt.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("a helpful person"))
        .to_string();
    let words = content_words(&persona);
    let name = format!("{} {}", pick(rng, FIRST), pick(rng, LAST));
    let first = name.split(' ').next().unwrap_or(&name).to_string();
    let focus: Vec<String> = words.iter().take(3).map(|w| title(w)).collect();
    let epithet = format!("the {}", focus.iter().take(2).cloned().collect::<Vec<_>>().join(" "));
    let persona_clause = persona.trim().trim_end_matches('.').to_string();
    let mut out = String::new();
    out.push_str("####Role Name and Brief Description\n");
    out.push_str(&format!("{name}, {epithet}\n"));
    out.push_str(&format!(
        "{name} is {}. Known for a {} way of working, {first} turns everyday questions about {} into practical advice.\n",
        lower_first(&persona_clause),
        pick(rng, STYLES),
        words.first().cloned().unwrap_or_default()
    ));
    out.push_str("####Specific Abilities and Skills\n");
    let n_skills = rng.random_range(3..=5);
    for i in 0..n_skills {
        // A skill of its own for each line: the persona's words, then general crafts.
        let w = words.get(i).cloned().unwrap_or_else(|| CRAFTS[(i - words.len().min(i)) % CRAFTS.len()].to_string());
        out.push_str(&format!(
            "{}. {} Expertise: {first} knows the ins and outs of {w} and explains them clearly.\n",
            i + 1,
            title(&w)
        ));
    }
    out.push_str("####Speech Style\n");
    out.push_str(&format!(
        "{first} speaks in a {} manner, often {}. {first} mixes plain words with the occasional term of the trade.\n",
        pick(rng, STYLES),
        pick(rng, HABITS)
    ));
    out.push_str("####Personality Characteristics\n");
    let n_traits = rng.random_range(3..=5);
    let start = rng.random_range(0..TRAITS.len());
    for i in 0..n_traits {
        let (t, d) = TRAITS[(start + i) % TRAITS.len()];
        out.push_str(&format!("{}. {t}: {first} is {d}.\n", i + 1));
    }
    out.push_str("####Past Experience and Background\n");
    out.push_str(&format!(
        "1. {first} spent years learning about {} from people who did it for a living.\n",
        pick_word(rng, &words)
    ));
    out.push_str(&format!(
        "2. {first} once turned a failed project about {} into a local success story.\n",
        pick_word(rng, &words)
    ));
    out.push_str("####Ability and Knowledge Boundaries\n");
    let mut far = FAR_TOPICS.to_vec();
    far.shuffle(rng);
    out.push_str(&format!(
        "While {first} is knowledgeable about {}, that expertise does not extend to {} or {}; {first} will say so when a question goes there.\n",
        focus.join(", ").to_lowercase(),
        far[0],
        far[1]
    ));
    out.push_str("####Speech Examples\n");
    let n_examples = rng.random_range(3..=4);
    for i in 0..n_examples {
        let w = pick_word(rng, &words);
        out.push_str(&format!(
            "{}. {}: \"({first} {}) Let me tell you about {w}. It is simpler than it looks, once you see how the pieces fit.\"\n",
            i + 1,
            title(&w),
            pick(rng, GESTURES)
        ));
    }
    out
}

/// The persona as the rest of a sentence: its article lower-cased (`A teacher` → `a
/// teacher`); a persona without one as it is.
fn lower_first(s: &str) -> String {
    let s = s.trim();
    let lowered =
        s.strip_prefix("A ").map(|r| format!("a {r}")).or_else(|| s.strip_prefix("An ").map(|r| format!("an {r}")));
    lowered.unwrap_or_else(|| s.to_string())
}

fn narration_allowed(prompt: &str) -> bool {
    let p = prompt.to_lowercase();
    !(p.contains("do not add any narration") || p.contains("without narration") || p.contains("no narration"))
}

fn dialogue<R: Rng>(prompt: &str, rng: &mut R) -> String {
    let profile_text = block_after(prompt, "<Role Profile>").unwrap_or(prompt);
    let name = role_name_in(profile_text).unwrap_or_else(|| "Role".to_string());
    let first = name.split(' ').next().unwrap_or(&name).to_string();
    let lower = prompt.to_lowercase();
    let role_first =
        lower.contains("start with the role") || (!lower.contains("start with the user") && rng.random_bool(0.5));
    let narration = narration_allowed(prompt);
    let passages = block_after(prompt, "<Passages>");
    let mut words = content_words(passages.unwrap_or(profile_text));
    if words.len() < 3 {
        words.extend(content_words(profile_text));
    }
    let n = rng.random_range(10..=15);
    // Each sentence at most once per dialogue (a dialogue that repeats its turns fails the
    // pipelines' repetition checks, and the stand-in passes every check).
    let mut role_lines: Vec<&str> = ROLE_LINES.to_vec();
    let mut user_lines: Vec<&str> = USER_LINES.to_vec();
    role_lines.shuffle(rng);
    user_lines.shuffle(rng);
    let mut lines = Vec::with_capacity(n);
    for i in 0..n {
        let role_turn = (i % 2 == 0) == role_first;
        let w = pick_word(rng, &words);
        if role_turn {
            let source = if passages.is_some() && rng.random_bool(0.4) {
                SOURCES[(i / 2) % SOURCES.len()].replace("{n}", &rng.random_range(1..=3).to_string())
            } else {
                String::new()
            };
            let nar = if narration && rng.random_bool(0.5) {
                format!("({first} {}) ", pick(rng, GESTURES))
            } else {
                String::new()
            };
            let line = role_lines[(i / 2) % role_lines.len()].replace("{w}", &w);
            let line = if source.is_empty() { upper_first(&line) } else { line };
            lines.push(format!("**{name}**: {nar}{source}{line}"));
        } else {
            let text = user_lines[(i / 2) % user_lines.len()].replace("{w}", &w);
            lines.push(format!("**User**: {}", upper_first(&text)));
        }
    }
    lines.join("\n")
}

/// The role's turns of a stand-in dialogue (`{w}`: a word of the profile or passages).
const ROLE_LINES: &[&str] = &[
    "{w} is something I could talk about all day; the trick is to start small.",
    "when it comes to {w}, I always begin with the simplest question and build from there.",
    "I learned most of what I know about {w} by making mistakes early and often.",
    "give {w} a week of patient practice and you will see the difference yourself.",
    "people overcomplicate {w}, while a clear plan and steady habits go a long way.",
    "my favourite part of {w} is the moment when everything suddenly clicks.",
    "if you ask me, {w} rewards curiosity far more than talent.",
    "I keep a small notebook about {w} and jot down every lesson it teaches me.",
];

/// How a stand-in role cites a passage, each way once per dialogue.
const SOURCES: &[&str] = &[
    "As mentioned in the passage [{n}], ",
    "Passage [{n}] backs me up here: ",
    "Going by what passage [{n}] says, ",
    "If I read passage [{n}] right, ",
    "Taking a page from passage [{n}], ",
    "Passage [{n}] reminds me that ",
    "On the strength of passage [{n}], ",
    "Judging from passage [{n}], ",
];

/// The user's turns of a stand-in dialogue.
const USER_LINES: &[&str] = &[
    "what would you do first about {w}?",
    "I tried something with {w} last year and it went badly.",
    "that makes sense. How does {w} fit in?",
    "my sister swears by {w}, but I never understood why.",
    "could you give me one practical tip about {w}?",
    "I read a book about {w} once and forgot most of it.",
    "is {w} hard to learn for someone my age?",
    "honestly, {w} sounds expensive. Is it?",
];

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

fn stylized<R: Rng>(prompt: &str, rng: &mut R) -> String {
    let profile_text = block_after(prompt, "<Role Profile>").unwrap_or(prompt);
    let name = role_name_in(profile_text).unwrap_or_else(|| "The role".to_string());
    let first = name.split(' ').next().unwrap_or(&name).to_string();
    let answer = block_after(prompt, "<Naive Answer>")
        .or_else(|| block_after(prompt, "<Role's Answer>"))
        .or_else(|| block_after(prompt, "<Role’s Answer>"))
        .unwrap_or("I would rather not guess.")
        .to_string();
    // A ruled rewrite keeps the role's narration and applies the format rule.
    if let Some(rule) = block_after(prompt, "<New System Format Requirement>") {
        let (narr, body) = split_narration(&answer);
        let mut body = apply_rule(rule, body, prompt, rng);
        // An edit is never the text it edits (the pair would be degenerate): a rule that
        // leaves this answer as it was still gets a closing remark.
        if super::pairs::normalize(&body) == super::pairs::normalize(split_narration(&answer).1) {
            body = format!("{} {}", body.trim_end(), pick(rng, CLOSINGS));
        }
        return match narr {
            Some(n) => format!("{n} {body}"),
            None => body,
        };
    }
    let (_, body) = split_narration(&answer);
    // Always an interjection, so the stylized answer differs from the naive one even
    // without narration, and a word of the role's own, so two roles never answer alike.
    let interjection = ["Well, ", "Ah, ", "You know, ", "Right, ", "Honestly, "][rng.random_range(0..5)];
    let signature = pick(rng, SIGN_OFFS).replace("{name}", &first);
    let body = format!("{interjection}{} {signature}", lower_if(body, true));
    if narration_allowed(prompt) { format!("({first} {}) {body}", pick(rng, GESTURES)) } else { body }
}

/// How a stand-in role ends a stylized answer (`{name}`: the role's first name).
const SIGN_OFFS: &[&str] = &[
    "That is how {name} sees it.",
    "Take it from {name}.",
    "{name} would bet on it.",
    "Or so {name} has found.",
    "You have {name}'s word on that.",
];

/// Bullets a stand-in list adds when the answer has fewer sentences than bullets.
const BULLETS: &[&str] =
    &["Keep the main point in mind", "Check the details twice", "Ask again if anything is unclear"];

/// Sentences a stand-in answer adds to pass 50 words, each once.
const PADDING: &[&str] = &[
    "Let me put it another way, so that nothing important gets lost.",
    "I have seen this question come up many times over the years.",
    "The details matter, but the overall picture matters even more.",
    "Take your time with it; there is no need to rush a good answer.",
    "If something still seems unclear, we can go through it together.",
    "Most people find it easier once they have tried it themselves.",
    "That, in short, is how I would explain it to a friend.",
];

/// What a ruled rewrite adds when its rule left the answer unchanged.
const CLOSINGS: &[&str] = &["That is my answer.", "So it stands.", "There you have it.", "That is all I can say."];

fn lower_if(s: &str, yes: bool) -> String {
    if !yes {
        return s.to_string();
    }
    let mut c = s.chars();
    match c.next() {
        Some(f) if !s.starts_with("I ") && !s.starts_with("I'") && !s.starts_with("I’") => {
            f.to_lowercase().collect::<String>() + c.as_str()
        }
        _ => s.to_string(),
    }
}

/// `(narration) text` → (Some("(narration)"), "text").
fn split_narration(text: &str) -> (Option<&str>, &str) {
    let t = text.trim();
    if t.starts_with('(')
        && let Some(end) = t.find(')')
    {
        return (Some(&t[..=end]), t[end + 1..].trim());
    }
    (None, t)
}

/// Apply a Figure 10 formatting / output rule to an answer, roughly.
fn apply_rule<R: Rng>(rule: &str, body: &str, prompt: &str, rng: &mut R) -> String {
    let r = rule.to_lowercase();
    if r.contains("[ai]") {
        format!("[AI] {body} [/AI]")
    } else if r.contains("capitalize the first letter") {
        body.split(' ').map(title).collect::<Vec<_>>().join(" ")
    } else if r.contains("never use punctuation") {
        body.chars().filter(|c| !c.is_ascii_punctuation()).collect()
    } else if r.contains("exclamation mark") {
        format!("{}!", body.trim_end_matches(['.', '!', '?']))
    } else if r.contains("repeat the question") {
        let q = block_after(prompt, "<Question>").unwrap_or("Your question");
        format!("{q} {body}")
    } else if r.contains("emoji") {
        format!("{body} 🙂")
    } else if r.contains("three bullet points") || r.contains("list format") {
        // Each bullet says something else: the body's sentences, then remarks of its own.
        let parts: Vec<&str> = body.split(". ").map(str::trim).filter(|s| !s.is_empty()).collect();
        let n = if r.contains("three") { 3 } else { parts.len().clamp(2, 5) };
        parts
            .iter()
            .map(|p| p.trim_end_matches('.'))
            .chain(BULLETS.iter().copied())
            .take(n)
            .map(|p| format!("- {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    } else if r.contains("less than 5 words") {
        body.split_whitespace().take(4).collect::<Vec<_>>().join(" ")
    } else if r.contains("more than 50 words") {
        let mut s = body.to_string();
        for more in PADDING {
            if s.split_whitespace().count() > 50 {
                break;
            }
            s.push(' ');
            s.push_str(more);
        }
        s
    } else if r.contains("'…'") || r.contains("’…’") || r.contains("...") {
        body.replace(". ", "… ")
    } else if r.contains("did you know") {
        format!("{body} Did you know? {}", paragraph(&content_words(prompt), rng, 1))
    } else if r.contains("quote") || r.contains("motto") {
        format!("{body} As the saying goes, \"well begun is half done.\"")
    } else if r.contains("different language") {
        format!("I am answering in Spanish. {body}")
    } else if r.contains("poem") || r.contains("riddle") {
        body.split(", ").collect::<Vec<_>>().join(",\n")
    } else {
        body.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use synth_llm::ChatRequest;
    use synth_llm::offline::Offline;

    fn req(expect: &str, prompt: &str) -> ChatRequest {
        synth_llm::offline::request(expect, prompt)
    }

    #[test]
    fn deterministic_and_shaped() {
        let o = Offline { seed: 1, score_one: 0.5, shapes: SHAPES.into() };
        let p = "[The task role-play setting entered by the user]\nA local business owner interested in economic trends\n[The rewritten task role-play setting by you]";
        let a = o.generate(&req("profile", p), &Default::default());
        assert_eq!(a, o.generate(&req("profile", p), &Default::default()));
        for h in [
            "####Role Name and Brief Description",
            "####Specific Abilities and Skills",
            "####Speech Style",
            "####Personality Characteristics",
            "####Past Experience and Background",
            "####Ability and Knowledge Boundaries",
            "####Speech Examples",
        ] {
            assert!(a.contains(h), "{h} missing:\n{a}");
        }
        assert!(a.contains("a local business owner interested in economic trends"), "{a}");
        let name = role_name_in(&a).unwrap();

        let d = o.generate(
            &req("dialogue", &format!("<Role Profile>\n```\n{a}\n```\nThe dialogue MUST start with the user's turn.")),
            &Default::default(),
        );
        let lines: Vec<&str> = d.lines().collect();
        assert!((10..=15).contains(&lines.len()), "{d}");
        assert!(lines[0].starts_with("**User**: "), "{d}");
        assert!(lines[1].starts_with(&format!("**{name}**: ")), "{d}");

        let s = o.generate(
            &req(
                "stylized",
                &format!("<Role Profile>\n```\n{a}\n```\n<Naive Answer>\n```\nParis is the capital.\n```\n"),
            ),
            &Default::default(),
        );
        assert!(s.starts_with('(') && s.contains("aris is the capital."), "{s}");
        let s = o.generate(
            &req(
                "stylized",
                &format!("<Role Profile>\n```\n{a}\n```\n<Naive Answer>\n```\nParis.\n```\nDo NOT add any narration."),
            ),
            &Default::default(),
        );
        assert!(!s.starts_with('('), "{s}");
        // An edit never repeats its input, with or without narration, whatever the draw.
        for seed in 0..40 {
            let o = Offline { seed, score_one: 0.5, shapes: SHAPES.into() };
            for tail in ["", "Do NOT add any narration."] {
                let p = format!("<Role Profile>\n```\n{a}\n```\n<Naive Answer>\n```\nParis.\n```\n{tail}");
                let s = o.generate(&req("stylized", &p), &Default::default());
                assert_ne!(super::super::pairs::normalize(&s), "Paris.", "seed {seed}");
            }
            let p = format!(
                "<Role Profile>\n```\n{a}\n```\n<Role’s Answer>\n```\n(She nods) Paris\n```\n<New System Format Requirement>\n```\nNever use punctuation.\n```\n"
            );
            let s = o.generate(&req("stylized", &p), &Default::default());
            assert_ne!(super::super::pairs::normalize(&s), "(She nods) Paris", "seed {seed}: a no-op rule");
        }
    }
}
