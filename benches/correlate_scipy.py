#!/usr/bin/env python3
"""The `correlate` benchmark's Python side (benches/correlate_scipy.sh runs it):

    gen DIR N       write DIR/pairs.csv: N rows of id, x, y (continuous, weakly correlated) and
                    xt, yt (1..5 integer scores, heavily tied), seeded
    scipy DIR       time scipy.stats pearsonr, spearmanr, kendalltau on both pairs (the CSV
                    read is not timed); write DIR/scipy.json
    compare DIR     compare DIR/synth-*.jsonl (synth inspect --json of the correlate
                    stages) with DIR/scipy.json: max |statistic| and relative p-value gaps
"""
import json
import math
import os
import sys
import time

import numpy as np


def gen(d, n):
    rng = np.random.default_rng(16)
    x = rng.standard_normal(n)
    # Weak dependence, so the p-values are neither 0 nor 1: r ~ 0.002 and ~ 0.004.
    y = 0.002 * x + rng.standard_normal(n)
    xt = rng.integers(1, 6, n)
    yt = np.where(rng.random(n) < 0.004, xt, rng.integers(1, 6, n))
    with open(os.path.join(d, "pairs.csv"), "w") as f:
        f.write("id,x,y,xt,yt\n")
        for i in range(n):
            f.write(f"{i},{float(x[i])!r},{float(y[i])!r},{int(xt[i])},{int(yt[i])}\n")


def load(d):
    cols = np.loadtxt(os.path.join(d, "pairs.csv"), delimiter=",", skiprows=1, usecols=(1, 2, 3, 4))
    return {"cont": (cols[:, 0], cols[:, 1]), "tied": (cols[:, 2], cols[:, 3])}


def run_scipy(d):
    from scipy import stats
    import scipy

    data = load(d)
    repeat = int(os.environ.get("REPEAT", "3"))
    out = {"scipy": scipy.__version__, "numpy": np.__version__, "results": {}, "wall": {}, "cpu": {}}
    for name, (x, y) in data.items():
        # Best of `repeat` per pair set (the three calls), wall and CPU time.
        best_wall, best_cpu = math.inf, math.inf
        for _ in range(repeat):
            w, c = time.perf_counter(), time.process_time()
            for method, fn in (("pearson", stats.pearsonr), ("spearman", stats.spearmanr), ("kendall", stats.kendalltau)):
                r = fn(x, y)
                out["results"][f"{name}/{method}"] = [float(r.statistic), float(r.pvalue)]
            best_wall, best_cpu = min(best_wall, time.perf_counter() - w), min(best_cpu, time.process_time() - c)
        out["wall"][name], out["cpu"][name] = best_wall, best_cpu
    json.dump(out, open(os.path.join(d, "scipy.json"), "w"), indent=1)
    print(json.dumps({"scipy_wall_s": {k: round(v, 3) for k, v in out["wall"].items()},
                      "scipy_cpu_s": {k: round(v, 3) for k, v in out["cpu"].items()}}))


def compare(d):
    ref = json.load(open(os.path.join(d, "scipy.json")))["results"]
    worst_stat, worst_p = 0.0, 0.0
    for name in ("cont", "tied"):
        for line in open(os.path.join(d, f"synth-{name}.jsonl")):
            row = json.loads(line)
            s, p = ref[f"{name}/{row['method']}"]
            ds = abs(row["statistic"] - s)
            dp = abs(row["p_value"] - p) / p if p > 0 else abs(row["p_value"] - p)
            worst_stat, worst_p = max(worst_stat, ds), max(worst_p, dp)
            print(f"{name:5} {row['method']:9} synth {row['statistic']:.15f} p {row['p_value']:.6e} | scipy {s:.15f} p {p:.6e} | "
                  f"|d stat| {ds:.1e} rel d p {dp:.1e}")
    print(json.dumps({"max_abs_statistic_diff": worst_stat, "max_rel_p_diff": worst_p}))


if __name__ == "__main__":
    cmd, d = sys.argv[1], sys.argv[2]
    if cmd == "gen":
        gen(d, int(sys.argv[3]))
    elif cmd == "scipy":
        run_scipy(d)
    else:
        compare(d)
