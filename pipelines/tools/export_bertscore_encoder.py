#!/usr/bin/env python3
"""Export a Hugging Face encoder as the ONNX model synth's BERTScore reads (`metrics` stage
option `bertscore_model`, `synth score --bertscore-model`): model.onnx returning the hidden
states of layer L as `last_hidden_state`, plus the tokenizer files.

bert_score keeps the first L layers of the model (`num_layers`) and takes the last one's
output; this script does the same before exporting, so the ONNX model's output is exactly
the representation bert_score scores with. The official RoleMRC setting is bert_score's
default for English, roberta-large with L = 17:

    pip install torch transformers          # CPU is enough; tested with torch 2.5.1, transformers 4.46.3
    python pipelines/tools/export_bertscore_encoder.py --model roberta-large --layers 17 --out models/roberta-large-L17
    synth score --input answers.jsonl --metrics bertscore --bertscore-model models/roberta-large-L17 --out scores.jsonl

--model is a Hub name or a local directory. Without --layers, all layers are kept (as
bert_score does for all-MiniLM-L6-v2 with num_layers=6).

The model is exported with the eager attention implementation and then, when the
`onnxruntime` package is installed, fused by ONNX Runtime's transformer optimizer (Attention,
EmbedLayerNormalization, SkipLayerNormalization, BiasGelu: one kernel each instead of a dozen
small ops; 18% less BERTScore time for MiniLM on 2 cores, BENCHMARKS.md). PyTorch's default
SDPA attention exports with NaN guards that no fusion recognises. The fused graph is checked
against the unfused one on sample texts (largest difference must stay under 1e-4, else the
unfused graph is kept) and computes the same numbers up to float rounding. --no-fuse skips it.

    pip install torch transformers onnx onnxruntime   # tested: 2.5.1, 4.46.3, 1.17.0, 1.24.4
    python pipelines/tools/export_bertscore_encoder.py --model sentence-transformers/all-MiniLM-L6-v2 --out models/minilm-fused
"""
import argparse
import os
import sys

import torch
from transformers import AutoModel, AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--out", required=True)
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--no-fuse", action="store_true", help="keep the graph as torch exported it")
    args = ap.parse_args()

    # Eager attention exports as plain MatMul/Softmax, which ONNX Runtime can fuse.
    model = AutoModel.from_pretrained(args.model, attn_implementation="eager")
    model.eval()
    # bert_score's model_type → layer truncation (bert_score.utils.get_model).
    if args.layers is not None:
        layers = model.encoder.layer
        if not 1 <= args.layers <= len(layers):
            raise SystemExit(f"--layers {args.layers}: the model has {len(layers)} layers")
        model.encoder.layer = torch.nn.ModuleList(list(layers)[: args.layers])
        model.config.num_hidden_layers = args.layers
    tokenizer = AutoTokenizer.from_pretrained(args.model, use_fast=True)
    os.makedirs(args.out, exist_ok=True)
    tokenizer.save_pretrained(args.out)  # tokenizer.json (+ tokenizer_config.json, special_tokens_map.json)
    model.config.save_pretrained(args.out)

    class Encoder(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            # bert_score calls model(input_ids, attention_mask=mask): token types default to 0.
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = tokenizer(["a short example", "another one, a bit longer than that"], padding=True, return_tensors="pt")
    path = os.path.join(args.out, "model.onnx")
    torch.onnx.export(
        Encoder(model),
        (ids["input_ids"], ids["attention_mask"]),
        path,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={
            "input_ids": {0: "batch", 1: "sequence"},
            "attention_mask": {0: "batch", 1: "sequence"},
            "last_hidden_state": {0: "batch", 1: "sequence"},
        },
        opset_version=args.opset,
        do_constant_folding=True,
    )
    fused = "" if args.no_fuse else fuse(path, model.config, tokenizer)
    print(f"wrote {args.out}/model.onnx ({model.config.model_type}, {model.config.num_hidden_layers} layers{fused})")


def fuse(path, config, tokenizer):
    """Fuse `path` in place with ONNX Runtime's transformer optimizer when it is installed
    and the fused graph agrees with the unfused one; returns a note for the summary line."""
    try:
        import numpy as np
        import onnxruntime as ort
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError:
        print("onnxruntime is not installed: the graph is not fused (pip install onnxruntime)", file=sys.stderr)
        return ", not fused"
    optimized = optimize_model(path, model_type="bert", num_heads=config.num_attention_heads,
                               hidden_size=config.hidden_size, opt_level=0)
    ops = optimized.get_fused_operator_statistics()
    candidate = path + ".fused"
    optimized.save_model_to_file(candidate)
    texts = ["a short example", "another one, a bit longer than that, with punctuation: yes!",
             "Ünïcödé and numbers 12345 " * 20, ""]
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="np")
    feed = {"input_ids": batch["input_ids"].astype(np.int64), "attention_mask": batch["attention_mask"].astype(np.int64)}
    def run(p):
        return ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    mask = batch["attention_mask"].astype(bool)
    diff = float(np.abs(run(path) - run(candidate))[mask].max())
    if diff > 1e-4:
        os.remove(candidate)
        print(f"the fused graph differs from the exported one by {diff:.2e}: keeping the unfused graph", file=sys.stderr)
        return ", not fused"
    os.replace(candidate, path)
    kept = {k: v for k, v in ops.items() if v}
    return f", fused {kept}, largest difference {diff:.1e}"


if __name__ == "__main__":
    main()
