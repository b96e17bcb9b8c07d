#!/usr/bin/env python3
"""Answer test questions with transformers on a GPU (the GPU path's generation).

    python3 pipelines/tools/generate_hf.py --test test.jsonl --model base=DIR --model sft=DIR \
        --out-dir answers/ [--max-new-tokens 256] [--batch-size 32] [--dtype bfloat16]

The same settings as the pipeline's `generate` stages (RoleMRC's official ones): greedy
(temperature 0), 256 new tokens, the model's own chat template over the `question` column
(a list of {role, content}; roles lowercased). Writes `<out-dir>/answered_<label>.jsonl` with
`id`, `task`, `question`, `reference` kept and `response`, `model`, `tokens_in`,
`tokens_out`, `finish_reason` added — the columns of a `generate` stage's output, so synth's
metrics / judge stages read them as a source — and prints one JSON line per model with its
wall time, tokens and peak GPU memory.
"""

import argparse
import json
import os
import sys
import time


def read_test(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            q = row.get("question")
            if isinstance(q, str):
                q = json.loads(q)
            if not isinstance(q, list) or not q:
                sys.exit(f"generate_hf: {path}:{n}: `question` is not a list of messages")
            row["question"] = [{"role": m["role"].lower(), "content": m["content"]} for m in q]
            rows.append(row)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--test", required=True)
    p.add_argument("--model", action="append", required=True, help="LABEL=CHECKPOINT_DIR (repeatable)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = read_test(args.test)
    os.makedirs(args.out_dir, exist_ok=True)
    for spec in args.model:
        label, _, path = spec.partition("=")
        if not path or not os.path.isdir(path):
            sys.exit(f"generate_hf: --model {spec}: expected LABEL=CHECKPOINT_DIR")
        started = time.time()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        tok = AutoTokenizer.from_pretrained(path)
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(device).eval()
        out_path = os.path.join(args.out_dir, f"answered_{label}.jsonl")
        tokens_out = 0
        with open(out_path, "w", encoding="utf-8") as out:
            for i in range(0, len(rows), args.batch_size):
                batch = rows[i : i + args.batch_size]
                prompts = [tok.apply_chat_template(r["question"], tokenize=False, add_generation_prompt=True) for r in batch]
                enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
                with torch.no_grad():
                    gen = model.generate(
                        **enc,
                        max_new_tokens=args.max_new_tokens,
                        do_sample=False,
                        pad_token_id=tok.pad_token_id,
                    )
                for r, ids_in, ids in zip(batch, enc.input_ids, gen):
                    new = ids[enc.input_ids.shape[1] :]
                    eos = (new == tok.eos_token_id).nonzero()
                    n = int(eos[0]) + 1 if len(eos) else len(new)
                    text = tok.decode(new[:n], skip_special_tokens=True)
                    tokens_out += n
                    record = {k: r[k] for k in ("id", "task", "reference") if k in r}
                    record["question"] = r["question"]
                    record.update(
                        response=text,
                        model=label,
                        tokens_in=int((ids_in != tok.pad_token_id).sum()),
                        tokens_out=n,
                        finish_reason="stop" if len(eos) else "length",
                    )
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
        seconds = time.time() - started
        peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
        print(
            json.dumps(
                {"model": label, "answers": len(rows), "tokens_out": tokens_out, "seconds": round(seconds, 2), "peak_gpu_mib": peak, "device": device}
            ),
            flush=True,
        )
        del model
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
