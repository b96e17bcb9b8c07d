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
"""
import argparse
import os

import torch
from transformers import AutoModel, AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--out", required=True)
    ap.add_argument("--opset", type=int, default=17)
    args = ap.parse_args()

    model = AutoModel.from_pretrained(args.model)
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
    torch.onnx.export(
        Encoder(model),
        (ids["input_ids"], ids["attention_mask"]),
        os.path.join(args.out, "model.onnx"),
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
    print(f"wrote {args.out}/model.onnx ({model.config.model_type}, {model.config.num_hidden_layers} layers)")


if __name__ == "__main__":
    main()
