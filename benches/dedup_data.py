#!/usr/bin/env python3
"""Dialogues for the near-duplicate benchmark (BENCHMARKS.md, "Near-duplicate removal"):
N dialogues of 10-15 turns (`{"id", "turns": [{"role", "content"}], "text"}`, `text` the
turns joined one per line), from a seeded vocabulary. A share of them copies an earlier
dialogue with a few words changed (`--near`), another share repeats one exactly
(`--exact`), so both tools have duplicates to find.

    python3 benches/dedup_data.py --dialogues 100000 --out /tmp/dedup/dialogues.jsonl
"""

import argparse
import json
import os
import random

WORDS = (
    "the a of to and in that it with for as on was is at by his her they we you he she from this be "
    "have had not but what all were when there can an your which their said if do will each about how "
    "up out them then many some so these would other into has more two time could no make than first "
    "been its who now people my made over did down only way find use may water long little very after "
    "words called just where most know get through back much before go good new write our used me man "
    "too any day same right look think also around another came come work three word must because does "
    "part even place well such here take why things help put years different away again off went old "
    "number great tell men say small every found still between name should home big give air line set "
    "own under read last never us left end along while might next sound below saw something thought both "
    "few those always looked show large often together asked house world going want school important "
    "until form food keep children feet land side without boy once animals life enough took sometimes "
    "four head above kind began almost live page got earth need far hand high year mother light parts "
    "country father let night following picture being study second eyes soon times story boys since "
    "white days ever paper hard near sentence better best across during today others however sure means "
    "knew try told young miles sun ways thing whole hear example heard several change answer room sea "
    "against top turned learn point city play toward five using himself usually money seen car morning "
    "garden bread market harvest weather rockets river mountain village teacher recipe letter music"
).split()


def sentence(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))).capitalize() + "."


def dialogue(rng):
    n = rng.randint(10, 15)
    first = rng.choice(["User", "Assistant"])
    other = "Assistant" if first == "User" else "User"
    return [{"role": first if i % 2 == 0 else other, "content": " ".join(sentence(rng) for _ in range(rng.randint(1, 3)))}
            for i in range(n)]


def perturb(turns, rng, share=0.03):
    out = []
    for t in turns:
        words = t["content"].split()
        for k in range(len(words)):
            if rng.random() < share:
                words[k] = rng.choice(WORDS)
        out.append({"role": t["role"], "content": " ".join(words)})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dialogues", type=int, default=100000)
    ap.add_argument("--near", type=float, default=0.10)
    ap.add_argument("--exact", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    kept = []
    with open(a.out, "w") as f:
        for i in range(a.dialogues):
            r = rng.random()
            if kept and r < a.near:
                turns = perturb(rng.choice(kept), rng)
            elif kept and r < a.near + a.exact:
                turns = rng.choice(kept)
            else:
                turns = dialogue(rng)
                if len(kept) < 5000:
                    kept.append(turns)
                else:
                    kept[rng.randrange(5000)] = turns
            text = "\n".join(t["content"] for t in turns)
            f.write(json.dumps({"id": f"d{i:06d}", "turns": turns, "text": text}) + "\n")


if __name__ == "__main__":
    main()
