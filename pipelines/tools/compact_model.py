#!/usr/bin/env python3
"""A model small enough to carry: 3-bit weights for a machine that downloads nothing.

    python3 pipelines/tools/compact_model.py pack   CHECKPOINT_DIR PACKED_DIR [--group 64]
    python3 pipelines/tools/compact_model.py unpack PACKED_DIR CHECKPOINT_DIR
    python3 pipelines/tools/compact_model.py cost   CHECKPOINT_DIR PACKED_DIR TEXT.jsonl

The GPU path of the whole loop (pipelines/tools/gpu_loop.sh) runs from a working tree of at
most 64 MiB. SmolLM2-135M-Instruct does not fit as any GGUF: Q4_1 is 98 MB, and the
K-quants (Q2_K, Q3_K) need rows of 256 values while most of this model's rows have 576, so
llama.cpp falls back to 4.5-bit types and a "Q2_K" file is still about 88 MB. `pack`
stores every matrix as symmetric 3-bit integers in groups of `--group` values along a row,
one float16 scale per group (3.25 bits per weight at 64: about 55 MB for 134.5M weights),
vectors (norms) as float16, plus the checkpoint's config and tokenizer files; `unpack`
rebuilds a float32 transformers checkpoint from it. `cost` says what the 3 bits cost: the
mean negative log-likelihood per token of the `reference` (else `text`) column of a JSONL
file under both models.

Requires numpy; `unpack` and `cost` also torch + safetensors (+ transformers for `cost`).
"""

import argparse
import glob
import json
import os
import shutil
import sys

import numpy as np

LEVELS = 3  # symmetric: values -3..3 (and -4, unused) in 3 bits
KEEP = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def quantize(w, group):
    """(int3 codes in 0..7 as uint8, float16 scales) of a 2-D float32 matrix, grouped along rows."""
    rows, cols = w.shape
    pad = (-cols) % group
    if pad:
        w = np.pad(w, ((0, 0), (0, pad)))
    g = w.reshape(rows, -1, group)
    scale = np.abs(g).max(axis=2, keepdims=True) / LEVELS
    scale[scale == 0] = 1.0
    scale16 = scale.astype(np.float16)
    q = np.clip(np.rint(g / scale16.astype(np.float32)), -LEVELS - 1, LEVELS).astype(np.int8) + 4
    return q.astype(np.uint8).reshape(rows, -1), scale16.reshape(rows, -1)


def pack_bits(codes):
    """Eight 3-bit codes into three bytes."""
    flat = codes.reshape(-1)
    pad = (-flat.size) % 8
    flat = np.pad(flat, (0, pad)).reshape(-1, 8).astype(np.uint32)
    word = np.zeros(flat.shape[0], dtype=np.uint32)
    for i in range(8):
        word |= flat[:, i] << (3 * i)
    return np.stack([(word >> s) & 0xFF for s in (0, 8, 16)], axis=1).astype(np.uint8).reshape(-1)


def unpack_bits(data, n):
    b = data.reshape(-1, 3).astype(np.uint32)
    word = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
    codes = np.stack([(word >> (3 * i)) & 7 for i in range(8)], axis=1).reshape(-1)
    return codes[:n].astype(np.uint8)


def load_state(directory):
    from safetensors.numpy import load_file

    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    if not files:
        sys.exit(f"compact_model: {directory}: no weights (*.safetensors)")
    state = {}
    for f in files:
        for k, v in load_file(f).items():
            state[k] = v.astype(np.float32)
    return state


def pack(src, dst, group):
    state = load_state(src)
    os.makedirs(dst, exist_ok=True)
    arrays, index = {}, {}
    for name in sorted(state):
        w = state[name]
        if w.ndim == 2:
            codes, scales = quantize(w, group)
            arrays[name + ".q3"] = pack_bits(codes)
            arrays[name + ".scale"] = scales
            index[name] = {"shape": list(w.shape), "group": group, "codes": int(codes.size)}
        else:
            arrays[name + ".f16"] = w.astype(np.float16)
            index[name] = {"shape": list(w.shape)}
    np.savez(os.path.join(dst, "weights.npz"), **arrays)
    with open(os.path.join(dst, "index.json"), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=1, sort_keys=True)
    for k in KEEP:
        if os.path.exists(os.path.join(src, k)):
            if k == "tokenizer.json":  # 3.5 MB of JSON: gzip keeps a quarter of it
                import gzip

                with open(os.path.join(src, k), "rb") as f:
                    data = gzip.compress(f.read(), compresslevel=9, mtime=0)
                with open(os.path.join(dst, k + ".gz"), "wb") as f:
                    f.write(data)
            else:
                shutil.copy(os.path.join(src, k), os.path.join(dst, k))
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(dst, "*")))
    print(json.dumps({"packed": dst, "tensors": len(index), "bytes": size}), flush=True)


def dequantized(directory):
    with open(os.path.join(directory, "index.json"), encoding="utf-8") as f:
        index = json.load(f)
    z = np.load(os.path.join(directory, "weights.npz"))
    state = {}
    for name, meta in index.items():
        shape = tuple(meta["shape"])
        if "group" in meta:
            rows, cols = shape
            group = meta["group"]
            codes = unpack_bits(z[name + ".q3"], meta["codes"]).reshape(rows, -1, group).astype(np.float32) - 4
            scales = z[name + ".scale"].astype(np.float32).reshape(rows, -1, 1)
            state[name] = (codes * scales).reshape(rows, -1)[:, :cols].copy()
        else:
            state[name] = z[name + ".f16"].astype(np.float32).reshape(shape)
    return state


def unpack(src, dst):
    import torch
    from safetensors.torch import save_file

    state = dequantized(src)
    os.makedirs(dst, exist_ok=True)
    save_file({k: torch.from_numpy(v) for k, v in state.items()}, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    for k in KEEP:
        if os.path.exists(os.path.join(src, k)):
            shutil.copy(os.path.join(src, k), os.path.join(dst, k))
        elif os.path.exists(os.path.join(src, k + ".gz")):
            import gzip

            with gzip.open(os.path.join(src, k + ".gz"), "rb") as f, open(os.path.join(dst, k), "wb") as out:
                out.write(f.read())
    print(json.dumps({"unpacked": dst, "tensors": len(state)}), flush=True)


def cost(checkpoint, packed, text_file, limit=64):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    texts = []
    with open(text_file, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            t = row.get("reference") or row.get("text")
            if isinstance(t, str) and t.strip():
                texts.append(t)
    texts = texts[:limit]
    tok = AutoTokenizer.from_pretrained(checkpoint)  # the checkpoint's own files
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()

    def nll():
        total, n = 0.0, 0
        with torch.no_grad():
            for t in texts:
                ids = tok(t, return_tensors="pt").input_ids[:, :512]
                if ids.shape[1] < 2:
                    continue
                out = model(ids, labels=ids)
                total += out.loss.item() * (ids.shape[1] - 1)
                n += ids.shape[1] - 1
        return total / max(n, 1), n

    before, n = nll()
    state = dequantized(packed)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    after, _ = nll()
    print(json.dumps({"texts": len(texts), "tokens": n, "nll_checkpoint": before, "nll_3bit": after, "ppl_ratio": float(np.exp(after - before))}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack")
    a.add_argument("src")
    a.add_argument("dst")
    a.add_argument("--group", type=int, default=64)
    b = sub.add_parser("unpack")
    b.add_argument("src")
    b.add_argument("dst")
    c = sub.add_parser("cost")
    c.add_argument("checkpoint")
    c.add_argument("packed")
    c.add_argument("text")
    args = p.parse_args()
    if args.cmd == "pack":
        pack(args.src, args.dst, args.group)
    elif args.cmd == "unpack":
        unpack(args.src, args.dst)
    else:
        cost(args.checkpoint, args.packed, args.text)


if __name__ == "__main__":
    main()
