#!/usr/bin/env python3
"""Write the RoleMRC demo data: personas.jsonl and msmarco.jsonl (stdlib only, deterministic).

    python3 pipelines/data/rolemrc-demo/generate.py [--personas 60] [--records 400] [--out DIR]

The files are checked in; rerunning with the defaults rewrites them byte for byte. Larger
sizes make benchmark inputs of the same shape (e.g. --personas 10500 --records 808700).
Layouts: personas like PersonaHub's persona.jsonl ({"persona": ...}); MS MARCO records
like microsoft/ms_marco v2.1 on the hub (passages as a struct of lists). About a quarter
of the questions have no answer ("No Answer Present."), as in MS MARCO.
"""
import argparse
import json
import os
import random

JOBS = ["beekeeper", "jazz pianist", "radio host", "retired astronaut", "night-shift nurse",
        "lighthouse keeper", "marine biologist", "street-food vendor", "chess coach",
        "volcanologist", "court stenographer", "tea sommelier", "bridge engineer",
        "wedding photographer", "falconer", "subway driver", "museum restorer", "glassblower",
        "forensic accountant", "sheep farmer"]
PLACES = ["Valparaíso", "Hokkaido", "Reykjavík", "Oaxaca", "Lisbon", "Nairobi", "Tromsø",
          "Kraków", "Busan", "Marrakesh", "Hobart", "Winnipeg", "Tbilisi", "Cork"]
TRAITS = ["who speaks four languages", "with a fear of pigeons", "who collects old maps",
          "with a dry sense of humour", "who restores vintage bicycles",
          "who writes letters to strangers", "who distrusts computers",
          "who quotes Shakespeare at dinner", "who has never seen the sea",
          "who keeps a diary in code"]
# Personas a real sample also contains: very short, very long, quotes, non-Latin scripts.
ODD = [
    "A cat.",
    'A stand-up comic whose catchphrase is "that\'s what the manual says".',
    "一位来自成都、热爱川剧变脸的退休中学物理老师。",
    "A 19th-century whaler, transported to a modern supermarket, trying to understand self-checkout "
    "machines, loyalty cards and why anyone would buy water in plastic bottles when it falls from "
    "the sky for free; he is polite, stubborn and suspicious of anything that beeps.",
    "An AI safety researcher who talks only in questions?",
    "A kid (aged 9) running a lemonade stand\twith a business plan.",
]

TOPICS = {
    "honey": ["Honey never spoils when sealed, because its low water content stops bacteria.",
              "A worker bee makes about a twelfth of a teaspoon of honey in its life.",
              "Bees fan their wings to evaporate water from nectar before capping the cells."],
    "volcanoes": ["Mauna Loa in Hawaii is the largest active volcano on Earth by volume.",
                  "Pyroclastic flows can move faster than 100 kilometres per hour.",
                  "Most volcanoes form where tectonic plates pull apart or push together."],
    "lighthouses": ["The Pharos of Alexandria was one of the Seven Wonders of the Ancient World.",
                    "A Fresnel lens lets a lighthouse beam be seen more than 20 miles away.",
                    "Most lighthouses were automated during the second half of the 20th century."],
    "chess": ["The longest possible chess game is bounded by the fifty-move rule.",
              "Castling is the only move in which two pieces of one player move at once.",
              "The word checkmate comes from the Persian phrase shah mat."],
    "tea": ["Green and black tea both come from the plant Camellia sinensis.",
            "Black tea is fully oxidised, while green tea is heated to stop oxidation.",
            "Water for green tea is best at about 80 degrees Celsius."],
    "bridges": ["A suspension bridge hangs its deck from cables anchored at both ends.",
                "The Akashi Kaikyo Bridge in Japan has a central span of 1,991 metres.",
                "Expansion joints let a bridge deck grow and shrink with temperature."],
    "falcons": ["The peregrine falcon can exceed 300 kilometres per hour in a dive.",
                "Falconers fly their birds with bells so they can find them in cover.",
                "Falcons kill with a notch in the beak called the tomial tooth."],
    "glass": ["Glass is made mostly of silica sand, soda ash and limestone.",
              "Glassblowers work the glass at about 1,100 degrees Celsius.",
              "Annealing cools glass slowly so that internal stresses do not crack it."],
    "sheep": ["A sheep's wool grows continuously and must be shorn at least once a year.",
              "Merino sheep produce some of the finest wool in the world.",
              "Sheep can recognise the faces of up to 50 other sheep."],
    "subways": ["The London Underground opened in 1863 as the first underground railway.",
                "The third rail of many subways carries about 600 volts of direct current.",
                "Tokyo's subway system carries billions of passengers every year."],
}
QUESTIONS = ["what is true about {t}", "how do {t} work", "why are {t} important",
             "facts about {t}", "what should I know about {t}", "define {t}"]
FILLER = ["It is a common question in encyclopaedias.", "Many visitors ask about it.",
          "Sources disagree on the details.", "This page was last edited recently.",
          "Click here to read more articles.", "Related searches are shown below."]
TYPES = ["DESCRIPTION", "NUMERIC", "ENTITY", "LOCATION", "PERSON"]


def personas(n, rng):
    out = []
    for i in range(n):
        if i % 10 == 9:
            out.append(ODD[(i // 10) % len(ODD)])
        else:
            out.append(f"A {rng.choice(JOBS)} from {rng.choice(PLACES)} {rng.choice(TRAITS)}.")
    return out


def record(i, rng):
    topic = rng.choice(sorted(TOPICS))
    facts = TOPICS[topic]
    k = rng.randint(3, 8)
    texts, selected = [], []
    gold = rng.randrange(k)
    for j in range(k):
        fact = facts[(i + j) % len(facts)]
        other = rng.choice(sorted(TOPICS))
        if j == gold:
            text = f"{fact} {rng.choice(FILLER)}"
        else:
            text = f"{rng.choice(TOPICS[other])} {rng.choice(FILLER)} {rng.choice(FILLER)}"
        texts.append(text)
        selected.append(0)
    answerable = rng.random() >= 0.25
    if answerable:
        selected[gold] = 1
        answers = [facts[(i + gold) % len(facts)]]
    else:
        answers = ["No Answer Present."]
    return {
        "answers": answers,
        "passages": {
            "is_selected": selected,
            "passage_text": texts,
            "url": [f"https://example.org/{topic}/{i}-{j}" for j in range(k)],
        },
        "query": rng.choice(QUESTIONS).format(t=topic) + ("" if i % 7 else "?"),
        "query_id": 1_000_000 + i,
        "query_type": rng.choice(TYPES),
        "wellFormedAnswers": [],
    }


ROLES = ["Sherlock Holmes", "Jack Sparrow", "Hermione Granger", "Gandalf", "Doctor Watson"]
ASKS = ["What do you think of {t}?", "Explain {t} to a child.", "Give me one fact about {t}.",
        "Why should I care about {t}?"]


def mix_rows(rng, n_role, n_sft, n_pref):
    """RoleMRC-mix inputs in their hub layouts: RoleBench (role, question, generated),
    RLHFlow SFT (messages), UltraFeedback binarized (prompt, chosen, rejected as
    conversations). The last row of each is broken on purpose (goes to failures)."""
    if min(n_role, n_sft, n_pref) == 0:
        return {}
    topics = sorted(TOPICS)
    rolebench = []
    for i in range(n_role):
        t = rng.choice(topics)
        role = rng.choice(ROLES)
        fact = rng.choice(TOPICS[t])
        rolebench.append({"role": role, "question": rng.choice(ASKS).format(t=t),
                          "generated": [f"As {role}, I would say this: {fact}"]})
    rolebench[-1]["generated"] = []
    rlhflow = []
    for i in range(n_sft):
        t = rng.choice(topics)
        msgs = [{"role": "user", "content": rng.choice(ASKS).format(t=t)},
                {"role": "assistant", "content": rng.choice(TOPICS[t])}]
        if i % 3 == 0:
            msgs += [{"role": "user", "content": "Tell me more."},
                     {"role": "assistant", "content": rng.choice(TOPICS[t]) + " " + rng.choice(FILLER)}]
        rlhflow.append({"messages": msgs, "conversation_id": i})
    ultra = []
    for i in range(n_pref):
        t = rng.choice(topics)
        q = rng.choice(ASKS).format(t=t)
        good, bad = rng.choice(TOPICS[t]), rng.choice(FILLER)
        ultra.append({"prompt": q, "prompt_id": f"p{i:04d}",
                      "chosen": [{"role": "user", "content": q}, {"role": "assistant", "content": good}],
                      "rejected": [{"role": "user", "content": q}, {"role": "assistant", "content": bad}],
                      "score_chosen": 8.0, "score_rejected": 3.0})
    rlhflow[-1]["messages"] = rlhflow[-1]["messages"][:1]
    ultra[-1]["rejected"] = [{"role": "user", "content": ultra[-1]["prompt"]}]
    return {"rolebench": rolebench, "rlhflow": rlhflow, "ultrafeedback": ultra}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--personas", type=int, default=60)
    ap.add_argument("--records", type=int, default=400)
    ap.add_argument("--mix", type=int, default=40, help="records per mix-in source (RLHFlow: 1.5x)")
    ap.add_argument("--seed", type=int, default=2025)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    with open(os.path.join(a.out, "personas.jsonl"), "w", encoding="utf-8") as f:
        for p in personas(a.personas, rng):
            f.write(json.dumps({"persona": p}, ensure_ascii=False) + "\n")
    rng = random.Random(a.seed + 1)
    with open(os.path.join(a.out, "msmarco.jsonl"), "w", encoding="utf-8") as f:
        for i in range(a.records):
            f.write(json.dumps(record(i, rng), ensure_ascii=False) + "\n")
    rng = random.Random(a.seed + 2)
    for name, rows in mix_rows(rng, a.mix, a.mix * 3 // 2, a.mix).items():
        os.makedirs(os.path.join(a.out, "mix"), exist_ok=True)
        with open(os.path.join(a.out, "mix", f"{name}.jsonl"), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
