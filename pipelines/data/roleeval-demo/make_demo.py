#!/usr/bin/env python3
"""Write a small RoleEval-shaped release for CI machines without ../shared/data/roleeval.

Same layout, header and quirks as the real release (../shared/specs/roleeval.md §5):
zh/{global,chinese}/{dev,test}/{category}_{split}.csv, header id,question,A,B,C,D (+answer in
dev), UTF-8, LF, RFC-4180 quoting; ids restart at 0 in every file; a numeric option, an option
with a leading space, an option with a comma and one with doubled quotes, a row with duplicate
options. The questions are synthetic (about invented characters), so the files carry no licence
question. Also key.csv: an answer key for the test questions (qkey, answer, type) in the format
roleeval_score reads; every fourth question is typed "reasoning", the rest "knowledge".

Deterministic: running it again writes the same bytes.  Usage: python3 make_demo.py [out_dir]
"""

import csv
import io
import os
import sys

CATEGORIES = ["celebrities", "anime_and_comics", "movies_and_tv_series", "games", "fiction"]
SUBSETS = {"global": 8, "chinese": 4}  # test questions per category file
DEV = 5
LETTERS = "ABCD"
NAMES = ["林远", "苏晴", "白川", "韩雪", "周岚", "叶舟", "沈默", "江离"]
PLACES = ["北海", "南城", "西川", "东港", "云镇", "雾岭"]


def question(cat, subset, i):
    """One synthetic question; the answer letter cycles so every letter occurs."""
    name = NAMES[(i + len(cat)) % len(NAMES)]
    answer = LETTERS[(i * 3 + len(subset) + len(cat)) % 4]
    kind = i % 4
    if kind == 0:
        q = f"{name}出生在哪座城市？"
        opts = [PLACES[(i + k) % len(PLACES)] for k in range(4)]
    elif kind == 1:
        q = f"{name}第一次登场是在第几集？"
        opts = [str(i + k + 1) for k in range(4)]  # numeric options stay text
    elif kind == 2:
        q = f"以下哪个不是{name}的朋友？"
        opts = [NAMES[(i + k + 1) % len(NAMES)] for k in range(4)]
    else:
        q = f"{name}在“{PLACES[i % len(PLACES)]}事件”之后做了什么？"
        opts = ["离开了家乡", "加入了商会", "写了一本书", "没有做任何事"]
    return q, opts, answer


def write_csv(path, header, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(buf.getvalue())


def main(out):
    key = []
    for subset, n_test in SUBSETS.items():
        for cat in CATEGORIES:
            dev = []
            for i in range(DEV):
                q, opts, a = question(cat, "dev", 100 + i)
                dev.append([i, q, *opts, a])
            write_csv(f"{out}/zh/{subset}/dev/{cat}_dev.csv", ["id", "question", *LETTERS, "answer"], dev)
            test = []
            for i in range(n_test):
                q, opts, a = question(cat, subset, i)
                if subset == "global" and cat == "celebrities" and i == 1:
                    opts[1] = " " + opts[1]  # a leading space, kept as written
                if subset == "global" and cat == "fiction" and i == 2:
                    opts[1], opts[2] = '"冒险家号"', "甲,乙"  # doubled quotes and a comma
                if subset == "chinese" and cat == "games" and i == 3:
                    opts[3] = opts[0]  # duplicate options, as 15 real rows have
                test.append([i, q, *opts])
                key.append([f"{subset}/{cat}/{i}", a, "reasoning" if i % 4 == 3 else "knowledge"])
            write_csv(f"{out}/zh/{subset}/test/{cat}_test.csv", ["id", "question", *LETTERS], test)
    write_csv(f"{out}/key.csv", ["qkey", "answer", "type"], key)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
