#!/usr/bin/env python3
"""Neuron-level activation analysis (RoleMRC §7 and Appendix H), the reference script of
synth's `neurons` stage. A port of the authors' interpretation/interpret.py (collect
activations) and interpretation/visualize.py (top-p% activation counts, heat maps,
base vs tuned discrepancy), LuJunru/RoleMRC, on plain PyTorch + transformers:

1. For every model and every probe row: the row's messages rendered with the model's
   chat template (`apply_chat_template(messages, tokenize=False)`, no generation prompt,
   as interpret.py), tokenized with the tokenizer's special tokens, one forward pass; per
   decoder layer the output of its attention block (`hook = attn_out`, transformer_lens's
   `blocks.{i}.hook_attn_out`) or of its MLP (`mlp_out`, `hook_mlp_out`) at the last
   token (`tensor[-1][-1]`), as float16.
2. Per group (a row's capability / task groups) and layer: for each row, the top p% of
   its d_model activations (`keep_top_percentage(matrix, 20)`: k = max(1, int(d * p/100))
   by numpy's descending argsort), then per neuron the number of rows in which it was
   kept and non-zero (`count_non_zero_by_dim`): the activation map, layers x d_model.
3. Figures, as visualize.py's `heat_map_by_blocks` (seaborn's heatmap drawn with
   matplotlib: same figure size, colour maps, labels and titles): each model's counts per
   group, and per compared pair (base, tuned) the discrepancy (tuned - base) divided by
   d_model (`delta_count / matrix.shape[2]`, visualize.py) or by the group's row count
   (Appendix H's f_i = N_i / N_total; `normalize`).

Without torch and transformers installed it still checks its configuration and the probe
file (`--check`). Reconstructed where the official code has no equivalent (marked [R] in
pipelines/analysis/README.md): transformer_lens is replaced by forward hooks on the
transformers modules it wraps (for RMSNorm models, Llama and Qwen2, its weight processing
does not change these activations); the official run used bfloat16 + flash-attention-2 on
GPU (`dtype`, `attn_implementation`).

Configuration: `--config FILE` (JSON, written by synth's `neurons` stage): `probe` (JSONL
of {"id", "groups": [...], "messages": [{"role", "content"}...]}), `output_dir`, `models`
({label: model path, hub id or "tiny-random-llama:SEED"}), `compare` ([[base, tuned]...]),
`hook`, `top_percent`, `normalize`, `dtype`, `device`, `max_length`, `roles`, `figures`
(["png", "svg"]), `titles` ({group: title}), `save_activations`, `attn_implementation`,
`threads`, `verify_hooks` (check the hooks against the residual stream first). Protocol lines on stdout (pipelines/trainers/README.md): SYNTH_PROGRESS per
row, SYNTH_OUTPUT {"kind": "maps" | "figure" | "activations", "path"}, SYNTH_METRICS per
model.
"""
import argparse
import json
import os
import sys
import time

HOOKS = ("attn_out", "mlp_out")
NORMALIZE = ("dimension", "samples")
DTYPES = ("bfloat16", "float16", "float32")


def protocol(tag, obj):
    print(f"{tag} {json.dumps(obj)}", flush=True)


def fail(msg):
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def read_config(path):
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    need = ["probe", "output_dir", "models"]
    for k in need:
        if k not in cfg:
            fail(f"{path}: \"{k}\" is missing")
    cfg.setdefault("compare", [])
    cfg.setdefault("hook", "attn_out")
    cfg.setdefault("top_percent", 20.0)
    cfg.setdefault("normalize", "dimension")
    cfg.setdefault("dtype", "bfloat16")
    cfg.setdefault("device", "auto")
    cfg.setdefault("max_length", None)
    cfg.setdefault("roles", "as_written")
    cfg.setdefault("figures", ["png", "svg"])
    cfg.setdefault("titles", {})
    cfg.setdefault("save_activations", False)
    cfg.setdefault("attn_implementation", None)
    cfg.setdefault("threads", None)
    cfg.setdefault("verify_hooks", False)
    if cfg["hook"] not in HOOKS:
        fail(f"{path}: hook must be one of {', '.join(HOOKS)}")
    if cfg["normalize"] not in NORMALIZE:
        fail(f"{path}: normalize must be one of {', '.join(NORMALIZE)}")
    if cfg["dtype"] not in DTYPES:
        fail(f"{path}: dtype must be one of {', '.join(DTYPES)}")
    if not (0 < float(cfg["top_percent"]) <= 100):
        fail(f"{path}: top_percent must be in (0, 100]")
    if not isinstance(cfg["models"], dict) or not cfg["models"]:
        fail(f"{path}: models must map labels to models")
    for pair in cfg["compare"]:
        if len(pair) != 2 or any(p not in cfg["models"] for p in pair):
            fail(f"{path}: compare {pair}: two labels of models")
    for fmt in cfg["figures"]:
        if fmt not in ("png", "svg"):
            fail(f"{path}: figures: {fmt} is not png or svg")
    return cfg


def read_probe(path, roles):
    rows = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        fail(f"{path}: {e}")
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                fail(f"{path}:{n}: not JSON: {e}")
            msgs = r.get("messages")
            if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs
            ):
                fail(f"{path}:{n}: \"messages\" must be a list of {{role, content}}")
            if not isinstance(r.get("groups"), list) or not r["groups"]:
                fail(f"{path}:{n}: \"groups\" must be a non-empty list")
            if roles == "lower":
                msgs = [{"role": m["role"].lower(), "content": m["content"]} for m in msgs]
            rows.append({"id": r.get("id", str(n)), "groups": r["groups"], "messages": msgs})
    if not rows:
        fail(f"{path}: no probe rows")
    return rows


# ---------------------------------------------------------------- models


def tiny_random_llama(seed, rows):
    """A tiny randomly initialised LlamaForCausalLM with a word-level tokenizer built from
    the probe texts and a simple chat template: nothing is downloaded (tests, smoke runs)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = {"<unk>", "<s>", "</s>", "<pad>"}
    for r in rows:
        for m in r["messages"]:
            words.update(m["content"].split())
            words.add(m["role"])
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>"] + sorted(words - {"<unk>", "<s>", "</s>", "<pad>"}))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    )
    torch.manual_seed(int(seed))
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    model = LlamaForCausalLM(config)
    return tokenizer, model


def load(spec, cfg, rows, torch):
    dtype = getattr(torch, cfg["dtype"])
    if spec.startswith("tiny-random-llama:"):
        tokenizer, model = tiny_random_llama(spec.split(":", 1)[1], rows)
        model = model.to(dtype)
    else:
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        version = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
        kwargs = {"dtype" if version >= (4, 56) else "torch_dtype": dtype}
        if cfg["attn_implementation"]:
            kwargs["attn_implementation"] = cfg["attn_implementation"]
        if cfg["device"] == "auto" and torch.cuda.is_available():
            kwargs["device_map"] = "auto"
        tokenizer = AutoTokenizer.from_pretrained(spec)
        model = AutoModelForCausalLM.from_pretrained(spec, **kwargs)
    if not hasattr(model, "hf_device_map"):
        device = cfg["device"]
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model = model.to(device)
    model.eval()
    return tokenizer, model


def decoder_layers(model):
    """The decoder blocks of a causal LM (Llama, Qwen2, Mistral, Gemma...: model.model.layers)."""
    for path in ("model.layers", "model.model.layers", "transformer.h", "gpt_neox.layers"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            return list(obj)
    fail(f"cannot find the decoder layers of {type(model).__name__}")


def verify_hooks(model, layers, tokenizer, row, torch, np):
    """Check that the hooks read the blocks' outputs: in a pre-norm decoder (Llama, Qwen2)
    the residual stream after layer i is the one before it plus the attention block's and
    the MLP block's outputs. Compared at the last token against output_hidden_states."""
    got = {}

    def grab(key):
        def fn(_m, _i, output):
            out = output[0] if isinstance(output, tuple) else output
            got[key] = out[-1][-1].detach().float().cpu().numpy()

        return fn

    handles = []
    for i, layer in enumerate(layers):
        handles.append(hook_module(layer, "attn_out").register_forward_hook(grab(("attn", i))))
        handles.append(hook_module(layer, "mlp_out").register_forward_hook(grab(("mlp", i))))
    text = tokenizer.apply_chat_template(row["messages"], tokenize=False)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=True)["input_ids"]
    with torch.no_grad():
        out = model(input_ids=ids.to(next(model.parameters()).device), output_hidden_states=True, use_cache=False)
    for h in handles:
        h.remove()
    hs = [h[-1][-1].float().cpu().numpy() for h in out.hidden_states]
    worst = 0.0
    # hidden_states[i] is layer i's input; the last one is after the final norm, so skip it.
    for i in range(len(layers) - 1):
        rebuilt = hs[i] + got[("attn", i)] + got[("mlp", i)]
        worst = max(worst, float(np.max(np.abs(rebuilt - hs[i + 1]))))
    return worst


def hook_module(layer, hook):
    name = "self_attn" if hook == "attn_out" else "mlp"
    for candidate in (name, "attn" if hook == "attn_out" else "mlp"):
        m = getattr(layer, candidate, None)
        if m is not None:
            return m
    fail(f"{type(layer).__name__} has no {name} module")


# ---------------------------------------------------------------- visualize.py


def keep_top_percentage(matrix, percentage, np):
    """visualize.py: keep the top `percentage`% of values in each row, others set to 0."""
    rows, cols = matrix.shape
    k = max(1, int(cols * (percentage / 100)))
    sorted_indices = np.argsort(matrix, axis=1)[:, ::-1]
    top_k_indices = sorted_indices[:, :k]
    mask = np.zeros_like(matrix, dtype=bool)
    np.put_along_axis(mask, top_k_indices, True, axis=1)
    return np.where(mask, matrix, 0)


def count_non_zero_by_dim(matrix, np):
    return np.count_nonzero(matrix, axis=0)


def heat_map(title, sub_title, matrix, path_stem, formats, plt, np):
    """visualize.py's heat_map_by_blocks: seaborn's heatmap (cbar, no x labels, y labels)
    drawn with matplotlib; 'bwr' when the matrix has negative values, else 'viridis'."""
    cmap = "bwr" if np.min(matrix) < 0 else "viridis"
    fig = plt.figure(figsize=(15, 5))
    ax = fig.add_subplot(1, 1, 1)
    mesh = ax.pcolormesh(matrix, cmap=cmap, rasterized=True)
    ax.set_xlim(0, matrix.shape[1])
    ax.set_ylim(matrix.shape[0], 0)
    ax.set_xticks([])
    ax.set_yticks(np.arange(matrix.shape[0]) + 0.5)
    ax.set_yticklabels([str(i) for i in range(matrix.shape[0])], rotation=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    cbar = fig.colorbar(mesh, ax=ax)
    cbar.ax.tick_params(labelsize=8)
    cbar.outline.set_visible(False)
    ax.set_title(sub_title)
    ax.set_xlabel("Dimension")
    ax.set_ylabel("Layers")
    written = []
    for fmt in formats:
        path = f"{path_stem}.{fmt}"
        tmp = path + ".part"
        if fmt == "png":
            fig.savefig(tmp, dpi=300, format="png", metadata={"Software": None})
        else:
            fig.savefig(tmp, format="svg", metadata={"Date": None, "Creator": None})
        os.replace(tmp, path)
        written.append(path)
    plt.close(fig)
    return written


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="JSON configuration (written by the neurons stage)")
    ap.add_argument("--check", action="store_true", help="check the configuration and probe file, import nothing heavy")
    args = ap.parse_args()
    cfg = read_config(args.config)
    rows = read_probe(cfg["probe"], cfg["roles"])
    groups = sorted({g for r in rows for g in r["groups"]})
    if args.check:
        print(
            f"would probe {len(rows)} rows in {len(groups)} groups with {len(cfg['models'])} model(s): "
            + ", ".join(f"{k}={v}" for k, v in cfg["models"].items()),
            flush=True,
        )
        return

    import numpy as np
    import torch

    if cfg["threads"]:
        torch.set_num_threads(int(cfg["threads"]))
    torch.manual_seed(0)
    out_dir = cfg["output_dir"]
    os.makedirs(out_dir, exist_ok=True)
    pct = float(cfg["top_percent"])
    counts = {}  # label -> group -> (layers, d) int64
    samples = {}  # label -> group -> rows
    for label, spec in cfg["models"].items():
        t0 = time.time()
        tokenizer, model = load(spec, cfg, rows, torch)
        layers = decoder_layers(model)
        captured = [None] * len(layers)

        def make_hook(i):
            def fn(_module, _inp, output):
                out = output[0] if isinstance(output, tuple) else output
                # interpret.py: tensor[-1][-1], the last batch row's last position.
                captured[i] = out[-1][-1].detach().to(torch.float16).cpu().numpy()

            return fn

        if cfg["verify_hooks"]:
            worst = verify_hooks(model, layers, tokenizer, rows[0], torch, np)
            protocol("SYNTH_METRICS", {"phase": f"{label}.verify", "residual_max_abs_error": worst})
            if not worst < 1e-3:
                fail(f"{label}: the hooked blocks do not add up to the residual stream (max error {worst})")
        handles = [hook_module(layer, cfg["hook"]).register_forward_hook(make_hook(i)) for i, layer in enumerate(layers)]
        device = next(model.parameters()).device
        per_group = {}
        raw = {} if cfg["save_activations"] else None
        for step, r in enumerate(rows, 1):
            text = tokenizer.apply_chat_template(r["messages"], tokenize=False)
            enc = tokenizer(
                text,
                return_tensors="pt",
                add_special_tokens=True,
                truncation=cfg["max_length"] is not None,
                max_length=cfg["max_length"],
            )
            with torch.no_grad():
                model(input_ids=enc["input_ids"].to(device), use_cache=False)
            acts = np.stack(captured)  # (layers, d) float16
            for g in r["groups"]:
                if g not in per_group:
                    per_group[g] = [np.zeros(acts.shape, dtype=np.int64), 0]
                for li in range(acts.shape[0]):
                    kept = keep_top_percentage(acts[li][None, :], pct, np)
                    per_group[g][0][li] += count_non_zero_by_dim(kept, np)
                per_group[g][1] += 1
                if raw is not None:
                    raw.setdefault(g, []).append(acts)
            protocol("SYNTH_PROGRESS", {"phase": label, "step": step, "total": len(rows)})
        for h in handles:
            h.remove()
        counts[label] = {g: v[0] for g, v in per_group.items()}
        samples[label] = {g: v[1] for g, v in per_group.items()}
        if raw is not None:
            path = os.path.join(out_dir, "activations", f"{label}.npz")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = path + ".part.npz"
            # interpret.py's all_matrix.npy: per group, layers x rows x d_model, float16.
            np.savez(tmp, **{g: np.stack(v, axis=1) for g, v in raw.items()})
            os.replace(tmp, path)
            protocol("SYNTH_OUTPUT", {"kind": "activations", "path": path})
        d_model = int(next(iter(counts[label].values())).shape[1])
        protocol(
            "SYNTH_METRICS",
            {"phase": label, "rows": len(rows), "layers": len(layers), "d_model": d_model, "seconds": round(time.time() - t0, 3)},
        )
        del model

    # The activation maps, one line per (model, group, layer).
    maps = os.path.join(out_dir, "maps.jsonl")
    with open(maps + ".part", "w", encoding="utf-8") as f:
        for label in cfg["models"]:
            for g in sorted(counts[label]):
                for li, layer_counts in enumerate(counts[label][g]):
                    f.write(
                        json.dumps(
                            {"model": label, "group": g, "layer": li, "samples": samples[label][g], "counts": [int(c) for c in layer_counts]}
                        )
                        + "\n"
                    )
    os.replace(maps + ".part", maps)
    protocol("SYNTH_OUTPUT", {"kind": "maps", "path": maps})

    if not cfg["figures"]:
        return
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "synth"
    import matplotlib.pyplot as plt

    titles = cfg["titles"]
    fig_dir = os.path.join(out_dir, "figures")
    for label in cfg["models"]:
        os.makedirs(os.path.join(fig_dir, label), exist_ok=True)
        for g in sorted(counts[label]):
            stem = os.path.join(fig_dir, label, f"{g}_layer_active_heatmap")
            for p in heat_map(g, titles.get(g, g), counts[label][g], stem, cfg["figures"], plt, np):
                protocol("SYNTH_OUTPUT", {"kind": "figure", "path": p})
    for base, tuned in cfg["compare"]:
        sub = os.path.join(fig_dir, f"{base}-vs-{tuned}")
        os.makedirs(sub, exist_ok=True)
        for g in sorted(set(counts[base]) & set(counts[tuned])):
            delta = counts[tuned][g] - counts[base][g]
            # visualize.py: delta_count / matrix.shape[2] (d_model); Appendix H: / rows.
            denom = delta.shape[1] if cfg["normalize"] == "dimension" else max(1, samples[base][g])
            stem = os.path.join(sub, f"{g}_layer_active_heatmap")
            for p in heat_map(g, titles.get(g, g), delta / denom, stem, cfg["figures"], plt, np):
                protocol("SYNTH_OUTPUT", {"kind": "figure", "path": p})


if __name__ == "__main__":
    main()
