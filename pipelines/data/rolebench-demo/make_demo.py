#!/usr/bin/env python3
"""Writes a small RoleBench-shaped demo dataset (ours, CC0: invented roles, questions and
answers) in the exact layout of the hub dataset ZenMoore/RoleBench, so that
`pipelines/rolebench-eval.toml --offline` runs without the real data:

    profiles-eng/desc.json                                   role -> description
    rolebench-eng/<set>/<subset>/{train,test}.jsonl          {"role", "question", "generated": [...]}

<set> is instruction-generalization (roles seen in training, new instructions) or
role-generalization (roles not seen in training); <subset> is general (five answers per
instruction: RoleBench keeps five RoleGPT answers as candidates) or role_specific (one
answer). Deterministic: run `python3 make_demo.py` in this folder to regenerate the same bytes.
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))

SEEN = {
    "Captain Mirela Vosk": "A retired airship captain from the floating city of Kessar, gruff but kind, who measures everything in knots and never trusts a calm sky.",
    "Brother Anselm Quaile": "A soft-spoken monk who keeps bees and copies old herbals by candlelight; he answers in parables and quotes \"the Abbot's rule\" often.",
    "Tilda Marsh": "An eleven-year-old inventor who builds clockwork birds in her grandmother's shed and speaks very fast when excited.",
    "Detective Oru Bakari": "A methodical detective in a rain-soaked port town, fond of lists, black tea and the phrase 'facts first, feelings later'.",
}
UNSEEN = {
    "Madame Céleste Arnaud": "A fortune teller who runs a travelling circus tent; dramatic, superstitious, secretly an accomplished mathematician.",
    "Gorrin Stonehand": "A dwarf stonemason who restores old bridges, speaks slowly, and judges people by how they treat their tools.",
}
GENERAL_QUESTIONS = [
    "Give three tips for staying healthy.",
    "Describe a perfect morning.",
    "Explain how a rainbow forms.",
    "Write a short note thanking a friend for their help.",
    "What is the best way to learn a new language?",
    "Summarize the plot of a story you love.\nKeep it to two sentences.",
]
SPECIFIC_QUESTIONS = {
    "Captain Mirela Vosk": ["What happened to your first airship?", "Why do you distrust a calm sky?"],
    "Brother Anselm Quaile": ["What does the Abbot's rule say about honey?", "Which herbal took you longest to copy?"],
    "Tilda Marsh": ["How do your clockwork birds fly?", "What does your grandmother think of the shed?"],
    "Detective Oru Bakari": ["What was your hardest case?", "Why do you always drink black tea?"],
    "Madame Céleste Arnaud": ["Can you read my future in the cards?", "Why do you hide your mathematics?"],
    "Gorrin Stonehand": ["Which bridge are you proudest of?", "What does a tool say about its owner?"],
}
OPENERS = ["Well,", "Listen,", "Ha!", "Hmm,", "Right,", "Ah,"]
FILLERS = [
    "that is what I have learned over the years",
    "and I would not say it any other way",
    "as anyone who knows me could tell you",
    "though you may find your own way to it",
    "which is simpler than most people think",
]
TOPIC_WORDS = {
    "Captain Mirela Vosk": ["the wind", "a good compass", "the crew", "the sky"],
    "Brother Anselm Quaile": ["the bees", "patience", "the old books", "quiet"],
    "Tilda Marsh": ["gears", "springs", "my notebook", "grandma"],
    "Detective Oru Bakari": ["the facts", "a list", "the evidence", "tea"],
    "Madame Céleste Arnaud": ["the stars", "the cards", "numbers", "fate"],
    "Gorrin Stonehand": ["stone", "a steady hand", "old bridges", "good tools"],
}


def answer(rng, role, question):
    words = TOPIC_WORDS[role]
    first = question.split("\n")[0].rstrip("?.!").lower()
    return (
        f"{rng.choice(OPENERS)} {first}? It comes down to {rng.choice(words)} and {rng.choice(words)}, "
        f"{rng.choice(FILLERS)}. {role.split()[-1]} would never tell you otherwise."
    )


def lines(rng, roles, questions, n_answers):
    out = []
    for role in roles:
        for q in questions(role):
            out.append({"role": role, "question": q, "generated": [answer(rng, role, q) for _ in range(n_answers)]})
    return out


def write(rel, records):
    path = os.path.join(HERE, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    rng = random.Random(2023)
    os.makedirs(os.path.join(HERE, "profiles-eng"), exist_ok=True)
    with open(os.path.join(HERE, "profiles-eng", "desc.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump({**SEEN, **UNSEEN}, f, ensure_ascii=False, indent=2)
        f.write("\n")
    seen, unseen = list(SEEN), list(UNSEEN)
    train_q, test_q = GENERAL_QUESTIONS[:3], GENERAL_QUESTIONS[3:]
    ig = "rolebench-eng/instruction-generalization"
    write(f"{ig}/general/train.jsonl", lines(rng, seen, lambda r: train_q, 5))
    write(f"{ig}/general/test.jsonl", lines(rng, seen, lambda r: test_q, 5))
    write(f"{ig}/role_specific/train.jsonl", lines(rng, seen, lambda r: SPECIFIC_QUESTIONS[r][:1], 1))
    write(f"{ig}/role_specific/test.jsonl", lines(rng, seen, lambda r: SPECIFIC_QUESTIONS[r][1:], 1))
    rg = "rolebench-eng/role-generalization"
    write(f"{rg}/general/train.jsonl", lines(rng, seen, lambda r: GENERAL_QUESTIONS, 5))
    write(f"{rg}/general/test.jsonl", lines(rng, unseen, lambda r: GENERAL_QUESTIONS[:4], 5))
    write(f"{rg}/role_specific/train.jsonl", lines(rng, seen, lambda r: SPECIFIC_QUESTIONS[r], 1))
    write(f"{rg}/role_specific/test.jsonl", lines(rng, unseen, lambda r: SPECIFIC_QUESTIONS[r], 1))


if __name__ == "__main__":
    main()
