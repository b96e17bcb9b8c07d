#!/usr/bin/env python3
"""Peers of `synth bench retrieve --method exact`: the same workload (Q queries x P passages x D,
random unit vectors, most and least similar passage per query by inner product) with
numpy + OpenBLAS in one blocked pass (matmul per block, argmax and argmin of the block) and with
FAISS IndexFlatIP (exact) in two passes (the max; the min as the max of the negated queries),
plus numpy's plain sgemm of the same total size for its own peak. Prints one JSON line each.

    benches/retrieve_python.sh [--queries 2000] [--passages 808700] [--dim 384]

(the .sh wrapper installs numpy and faiss-cpu into .tools/benchvenv first). Run it right after
`synth bench retrieve` with the same sizes: the VM's speed drifts, so compare ratios taken in
one session.
"""
import argparse
import json
import os
import time

import numpy as np


def unit(rng, n, d):
    v = rng.uniform(-1.0, 1.0, size=(n, d)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--passages", type=int, default=808700)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--block", type=int, default=16384, help="passages per numpy block")
    ap.add_argument("--skip-faiss", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(42)
    q = unit(rng, a.queries, a.dim)
    c = unit(rng, a.passages, a.dim)
    flop = 2.0 * a.queries * a.passages * a.dim
    try:
        from threadpoolctl import threadpool_info

        blas = [(i.get("internal_api"), i.get("architecture"), i.get("num_threads")) for i in threadpool_info()]
    except Exception:  # threadpoolctl is optional
        blas = None

    # numpy: one blocked pass, max and min together.
    t = time.perf_counter()
    best_max = np.full(a.queries, -np.inf, dtype=np.float32)
    best_min = np.full(a.queries, np.inf, dtype=np.float32)
    arg_max = np.zeros(a.queries, dtype=np.int64)
    arg_min = np.zeros(a.queries, dtype=np.int64)
    for j0 in range(0, a.passages, a.block):
        s = q @ c[j0 : j0 + a.block].T
        i_max, i_min = s.argmax(axis=1), s.argmin(axis=1)
        v_max, v_min = s[np.arange(a.queries), i_max], s[np.arange(a.queries), i_min]
        better = v_max > best_max
        best_max[better], arg_max[better] = v_max[better], i_max[better] + j0
        better = v_min < best_min
        best_min[better], arg_min[better] = v_min[better], i_min[better] + j0
    wall = time.perf_counter() - t
    print(json.dumps({"peer": "numpy one pass", "blas": blas, "wall_seconds": round(wall, 3),
                      "gflops": round(flop / wall / 1e9, 3)}))

    # numpy's own sgemm peak on a matrix product of the same shape per block.
    b = c[: a.block]
    reps = max(1, int(3.0 / max(1e-3, wall / (a.passages / a.block))))
    t = time.perf_counter()
    for _ in range(reps):
        s = q @ b.T
    wall = time.perf_counter() - t
    print(json.dumps({"peer": "numpy sgemm (queries x block)", "gflops": round(2.0 * a.queries * a.block * a.dim * reps / wall / 1e9, 3)}))

    if a.skip_faiss:
        return
    import faiss

    t = time.perf_counter()
    index = faiss.IndexFlatIP(a.dim)
    index.add(c)
    build = time.perf_counter() - t
    t = time.perf_counter()
    index.search(q, 1)
    index.search(-q, 1)
    wall = time.perf_counter() - t
    print(json.dumps({"peer": "faiss IndexFlatIP two passes", "faiss": faiss.__version__, "threads": faiss.omp_get_max_threads(),
                      "add_seconds": round(build, 3), "wall_seconds": round(wall, 3), "gflops": round(2 * flop / wall / 1e9, 3)}))


if __name__ == "__main__":
    main()
