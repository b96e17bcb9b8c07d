#!/usr/bin/env python3
"""The peer of benches/characterbench_render.rs: the official judge-input builder's logic
(construct_prompts/process_wo_context_{zh,en}_all.py, as tests/fixtures/characterbench/
reference_prompts.py reproduces it, templates held in memory as the official constants are)
over every record of a release directory, human-agreement mode, `repeat` times, one thread.
Prints one JSON line with the rates and the SHA-256 of all judge prompts in the same order
as the Rust benchmark (dimension table order, then file order, zh before en per record).

    python3 benches/characterbench_render.py ../shared/data/characterbench/eval_data/raw_data 20
"""
import functools
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/fixtures/characterbench"))
import reference_prompts as ref  # noqa: E402

ref.template = functools.lru_cache(maxsize=None)(ref.template)
ORDER = json.load(open(os.path.join(HERE, "../pipelines/prompts/characterbench/dimensions.json"), encoding="utf-8"))["dimensions"]


def main():
    data, repeat = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20
    t0 = time.perf_counter()
    items = []
    for d in ORDER:
        path = os.path.join(data, f"{d['id']}_test.json")
        if os.path.exists(path):
            for item in json.load(open(path, encoding="utf-8")):
                items.append((d["id"], item))
    read_s = time.perf_counter() - t0

    def render_all():
        out = []
        for dim, item in items:
            out.append(ref.judge_zh(item, dim, item["response_messages"]["response"]))
            out.append(ref.judge_en(item, dim, item["translation_en"]["response_messages"]["response"]))
        return out

    digest = hashlib.sha256("".join(render_all()).encode("utf-8")).hexdigest()
    t1 = time.perf_counter()
    nbytes = 0
    for _ in range(repeat):
        nbytes += sum(len(p.encode("utf-8")) for p in render_all())
    render_s = time.perf_counter() - t1
    n = 2 * len(items)
    print(json.dumps({
        "records": n, "read_s": round(read_s, 4), "render_s": round(render_s, 4), "repeat": repeat,
        "judge_prompts_per_s": round(n * repeat / render_s), "mb_per_s": round(nbytes / render_s / 1e6, 1),
        "end_to_end_prompts_per_s": round(n / (read_s + render_s / repeat)), "sha256": digest,
    }))


if __name__ == "__main__":
    main()
