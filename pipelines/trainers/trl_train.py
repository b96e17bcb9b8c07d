#!/usr/bin/env python3
"""Reference trainer for synth's `train` stage: SFT, then DPO from the SFT checkpoint,
with TRL (https://huggingface.co/docs/trl).

    python3 pipelines/trainers/trl_train.py --sft sft.jsonl --dpo dpo.jsonl \
        --output-dir out/train --base-model meta-llama/Meta-Llama-3-8B-Instruct

Data: the files synth's `train` stage writes, in TRL's conversational formats —
`{"messages": [...]}` for SFT and `{"prompt": [...], "chosen": [...], "rejected": [...]}`
for DPO. Defaults are RoleMRC's Table 8 (SFT lr 1e-5, DPO lr 2e-5, beta 0.1, batch 8,
gradient accumulation 2, 1 epoch, warmup 0.04, cosine, bf16).

Besides ordinary log lines it prints the synth trainer protocol on stdout (see
pipelines/trainers/README.md):

    SYNTH_PROGRESS {"phase": "sft", "step": 3, "total": 10, "loss": 1.23}
    SYNTH_CHECKPOINT {"phase": "sft", "path": "out/train/sft", "step": 10, "final": true}
    SYNTH_METRICS {"phase": "sft", "train_loss": 1.1, ...}

Layout: <output-dir>/sft and <output-dir>/dpo hold the final models (with the
tokenizer); intermediate checkpoints (only with --save-steps) go to
<output-dir>/<phase>/checkpoint-<step>.

`--tiny-random-llama` replaces the base model by a tiny randomly initialised
LlamaForCausalLM with a word-level tokenizer built from the training data (nothing is
downloaded): a GPU smoke test of the whole path in a minute, not a useful model.

Requires: torch, transformers, datasets, trl (>= 0.20; processing_class, max_length).
Smoke-tested (CPU, --tiny-random-llama, fp32) with trl 0.21.0 / transformers 4.56.2 /
torch 2.5.1 and with trl 1.16.0 / transformers 5.23.0 / torch 2.15.0.
For multi-GPU runs, launch it with accelerate (`accelerate launch pipelines/trainers/...`)
by changing the stage's `command`.
"""

import argparse
import json
import math
import os
import sys

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]


def main_process():
    return int(os.environ.get("RANK", "0")) == 0


def emit(tag, payload):
    """One protocol line (main process only)."""
    if main_process():
        print(f"{tag} {json.dumps(payload, default=str)}", flush=True)


def log(message):
    if main_process():
        print(f"trl_train: {message}", flush=True)


def as_bool(text):
    value = str(text).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="SFT then DPO with TRL, reporting to synth")
    p.add_argument("--sft", required=True, help="SFT data (JSONL, conversational messages)")
    p.add_argument("--dpo", required=True, help="DPO data (JSONL, conversational preference)")
    p.add_argument("--output-dir", required=True, help="checkpoints go to <dir>/sft and <dir>/dpo")
    p.add_argument("--base-model", required=True, help="hub id or local path of the model to start from")
    # RoleMRC Table 8.
    p.add_argument("--sft-lr", type=float, default=1e-5)
    p.add_argument("--dpo-lr", type=float, default=2e-5)
    p.add_argument("--beta", type=float, default=0.1, help="DPO beta")
    p.add_argument("--batch-size", type=int, default=8, help="per-device train batch size")
    p.add_argument("--grad-acc", type=int, default=2, help="gradient accumulation steps")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--warmup-ratio", type=float, default=0.04)
    p.add_argument("--scheduler", default="cosine", help="transformers lr_scheduler_type")
    p.add_argument("--bf16", type=as_bool, default=True, help="true/false")
    p.add_argument("--max-steps", type=int, default=-1, help="stop each phase after this many steps (-1: no limit)")
    # Practicalities.
    p.add_argument("--max-length", type=int, default=None, help="truncate sequences to this many tokens")
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--save-steps", type=int, default=0, help="also save intermediate checkpoints every N steps")
    p.add_argument("--gradient-checkpointing", type=as_bool, default=False)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--phases", default="sft,dpo", help="which phases to run, in order")
    p.add_argument(
        "--export-gguf",
        default="",
        choices=["", "same", "f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"],
        help="with a GGUF --base-model: also write <output-dir>/{base,sft,dpo}.gguf (export_gguf.py; the base through the same round trip, checked tensor by tensor) for synth's local provider",
    )
    p.add_argument(
        "--full-determinism",
        type=as_bool,
        default=True,
        help="transformers' enable_full_determinism (deterministic torch algorithms): same config, same weights on the same machine",
    )
    p.add_argument(
        "--tiny-random-llama",
        action="store_true",
        help="smoke test: a tiny random Llama and a word-level tokenizer from the data instead of --base-model",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="only check the arguments and both data files (TRL's conversational layouts), without torch; exit 1 naming file:line of the first bad row",
    )
    return p.parse_args(argv)


ROLES = ("system", "user", "assistant")


def check_messages(messages, where, last_role=None):
    """A non-empty list of {"role", "content"} messages with known roles."""
    if not isinstance(messages, list) or not messages:
        return f"{where}: not a non-empty list of messages"
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in ROLES:
            return f"{where}[{k}]: not a message with a role in {ROLES} and a text content"
    if last_role and messages[-1]["role"] != last_role:
        return f"{where}: the last message is not the {last_role}'s"
    return None


def check_data(args):
    """Count the rows of both files, or exit 1 naming the first bad one (file:line)."""
    counts = {}
    for phase, path in (("sft", args.sft), ("dpo", args.dpo)):
        n = 0
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{line_no}"
                try:
                    row = json.loads(line)
                except ValueError as e:
                    sys.exit(f"trl_train: {where}: not JSON: {e}")
                if not isinstance(row, dict):
                    sys.exit(f"trl_train: {where}: not a JSON object")
                if phase == "sft":
                    problem = check_messages(row.get("messages"), f"{where}: messages", "assistant")
                else:
                    problem = check_messages(row.get("prompt"), f"{where}: prompt")
                    for key in ("chosen", "rejected"):
                        problem = problem or check_messages(row.get(key), f"{where}: {key}", "assistant")
                if problem:
                    sys.exit(f"trl_train: {problem}")
                n += 1
        counts[phase] = n
    return counts


def read_messages(path, keys):
    """Every message list of a JSONL file (for the tiny tokenizer's vocabulary)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                for k in keys:
                    yield from row.get(k) or []


def build_tiny_llama(args, directory):
    """A tiny random LlamaForCausalLM and a word-level tokenizer built from the data,
    saved to `directory` so both phases load it like any base model."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<s>", "<|end|>"] + ROLE_TOKENS
    split = pre_tokenizers.Whitespace()
    words = set()
    for path, keys in ((args.sft, ["messages"]), (args.dpo, ["prompt", "chosen", "rejected"])):
        for message in read_messages(path, keys):
            words.update(word for word, _ in split.pre_tokenize_str(message["content"]))
    words.difference_update(specials)
    vocab = {tok: i for i, tok in enumerate(specials + sorted(words))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="<|end|>",
        additional_special_tokens=ROLE_TOKENS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 1024

    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    log(f"tiny random Llama ({sum(p.numel() for p in model.parameters())} parameters, {len(vocab)} tokens) in {directory}")
    return directory


def gguf_args(model_path):
    """from_pretrained arguments of a model path: a `.gguf` file is loaded (dequantized to
    float32) by transformers from its folder with `gguf_file`."""
    if model_path.endswith(".gguf"):
        if not os.path.isfile(model_path):
            sys.exit(f"trl_train: {model_path}: no such GGUF file")
        return os.path.dirname(os.path.abspath(model_path)), {"gguf_file": os.path.basename(model_path)}
    return model_path, {}


def load(model_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, extra = gguf_args(model_path)
    if extra:
        extra["dtype"] = torch.float32
    tokenizer = AutoTokenizer.from_pretrained(where, **{k: v for k, v in extra.items() if k == "gguf_file"})
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        # Base models ship without one; TRL needs it for conversational data.
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.add_special_tokens({"additional_special_tokens": ROLE_TOKENS})
    model = AutoModelForCausalLM.from_pretrained(where, **extra)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    return model, tokenizer


LAST_LOGGED = {}
# phase → every SYNTH_PROGRESS payload (kept in the phase's marker: a resumed run reports
# the same loss curve again).
PROGRESS = {}


def synth_callback(phase):
    from transformers import TrainerCallback

    class SynthCallback(TrainerCallback):
        """Reports progress and checkpoints to synth."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero:
                return
            logs = logs or {}
            payload = {"phase": phase, "step": state.global_step, "total": state.max_steps}
            for key in ("loss", "learning_rate", "grad_norm", "rewards/accuracies", "rewards/margins", "epoch"):
                value = logs.get(key)
                if isinstance(value, (int, float)):
                    # A non-finite loss or margin is reported as such (as a string), not dropped.
                    payload[key] = value if math.isfinite(value) else str(value)
                    LAST_LOGGED.setdefault(phase, {})[key] = payload[key]
            emit("SYNTH_PROGRESS", payload)
            PROGRESS.setdefault(phase, []).append(payload)

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
                emit("SYNTH_CHECKPOINT", {"phase": phase, "path": path, "step": state.global_step})

    return SynthCallback()


def version_fields(args):
    """Fields whose name changed across transformers versions, as the installed one takes
    them: v5 removed `warmup_ratio` (a float in [0, 1) in `warmup_steps` is a ratio) and
    renamed `gradient_checkpointing` to `activation_checkpointing`."""
    import dataclasses
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    out = {}
    if "warmup_ratio" in names:
        out["warmup_ratio"] = args.warmup_ratio
    elif 0 <= args.warmup_ratio < 1:
        out["warmup_steps"] = args.warmup_ratio
    else:
        sys.exit(f"trl_train: --warmup-ratio must be in [0, 1), got {args.warmup_ratio}")
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    out[checkpointing] = args.gradient_checkpointing
    return out


def common_config(args, phase, lr):
    """TrainingArguments fields shared by SFTConfig and DPOConfig."""
    return dict(
        **version_fields(args),
        output_dir=os.path.join(args.output_dir, phase),
        learning_rate=lr,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_acc,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        lr_scheduler_type=args.scheduler,
        bf16=args.bf16,
        logging_steps=args.logging_steps,
        save_strategy="steps" if args.save_steps > 0 else "no",
        save_steps=args.save_steps if args.save_steps > 0 else 500,
        report_to="none",
        disable_tqdm=True,  # progress goes to synth as SYNTH_PROGRESS
        seed=args.seed,
        data_seed=args.seed,
        full_determinism=args.full_determinism,
    )


def finish(trainer, tokenizer, phase, result):
    """Save the phase's model; its checkpoint line and metrics (emitted by `complete`)."""
    out = trainer.args.output_dir
    trainer.save_model(out)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(out)  # with the chat template, so vLLM can serve the checkpoint
    metrics = {k: v for k, v in result.metrics.items() if isinstance(v, (int, float, str))}
    metrics["global_step"] = trainer.state.global_step
    import torch

    if torch.cuda.is_available():
        metrics["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    last = LAST_LOGGED.get(phase, {})
    if phase == "dpo":
        # The last logged reward margin and accuracy (chosen vs rejected) of the DPO phase.
        for key, name in (("rewards/margins", "reward_margin"), ("rewards/accuracies", "reward_accuracy")):
            if key in last:
                metrics[name] = last[key]
    return out, trainer.state.global_step, metrics


# --- Resuming a chain: a phase that finished (its model saved, exported when asked) leaves a
# marker naming what it was trained from; a re-run with the same inputs reports it again
# instead of training it again.


def file_digest(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def phase_key(args, phase, start):
    """What a phase's result depends on: its data, the model it starts from, the settings."""
    import hashlib

    data = args.sft if phase == "sft" else args.dpo
    settings = {k: v for k, v in vars(args).items() if k not in ("output_dir", "check", "phases")}
    doc = json.dumps({"phase": phase, "data": file_digest(data), "start": start, "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()


def marker_path(args, phase):
    return os.path.join(args.output_dir, f"{phase}.done.json")


def finished(args, phase, key):
    """The marker of a phase finished earlier with this key, if its files are all there."""
    try:
        with open(marker_path(args, phase), encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    files = [m.get("path")] + ([m["gguf"]] if m.get("gguf") else [])
    if m.get("key") != key or not all(p and os.path.exists(p) for p in files):
        return None
    return m


def complete(args, phase, key, path, step, metrics, gguf=None, progress=None):
    """Report a finished phase to synth and leave its marker (written last: atomically).
    `progress`: the logged steps of a phase finished earlier, reported again."""
    for payload in progress or []:
        emit("SYNTH_PROGRESS", payload)
    progress = progress if progress is not None else PROGRESS.get(phase, [])
    line = {"phase": phase, "path": path, "step": step, "final": True}
    if gguf:
        line["gguf"] = gguf
    emit("SYNTH_CHECKPOINT", line)
    if metrics:
        emit("SYNTH_METRICS", {"phase": phase, **metrics})
    if main_process():
        marker = {"key": key, "path": path, "step": step, "metrics": metrics, "gguf": gguf, "progress": progress}
        tmp = marker_path(args, phase) + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(marker, f, sort_keys=True)
        os.replace(tmp, marker_path(args, phase))


def export_gguf(args, phase, checkpoint=None, state=None):
    """`<output-dir>/<phase>.gguf` from a checkpoint folder (or, for the base, the loaded
    weights, checked against the template)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import export_gguf as exporter

    out = os.path.join(args.output_dir, f"{phase}.gguf")
    try:
        if state is None:
            state = exporter.load_checkpoint(checkpoint)
        n = exporter.export(
            args.base_model, state, out, args.export_gguf, verify=phase == "base", source=checkpoint or args.base_model
        )
    except exporter.ExportError as e:
        sys.exit(f"trl_train: exporting {phase} to GGUF: {e}")
    log(f"{phase}: exported {n} tensors as {args.export_gguf} to {out}")
    return out


def train_sft(args, model_path):
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = load(model_path)
    data = load_dataset("json", data_files=args.sft, split="train")
    log(f"SFT: {len(data)} conversations from {args.sft}")
    extra = {"max_length": args.max_length} if args.max_length else {}
    config = SFTConfig(**common_config(args, "sft", args.sft_lr), **extra)
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[synth_callback("sft")],
    )
    return finish(trainer, tokenizer, "sft", trainer.train())


def train_dpo(args, model_path):
    from datasets import load_dataset
    from trl import DPOConfig, DPOTrainer

    model, tokenizer = load(model_path)
    data = load_dataset("json", data_files=args.dpo, split="train")
    log(f"DPO: {len(data)} preference pairs from {args.dpo}, starting from {model_path}")
    extra = {"max_length": args.max_length} if args.max_length else {}
    config = DPOConfig(beta=args.beta, **common_config(args, "dpo", args.dpo_lr), **extra)
    trainer = DPOTrainer(
        model=model,
        ref_model=None,  # TRL keeps a frozen copy of the starting (SFT) model as the reference
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[synth_callback("dpo")],
    )
    return finish(trainer, tokenizer, "dpo", trainer.train())


def main(argv=None):
    args = parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in ("sft", "dpo")]
    if unknown:
        sys.exit(f"trl_train: unknown phase(s) {unknown}; use sft and/or dpo")
    if args.check:
        counts = check_data(args)
        base = "a tiny random Llama" if args.tiny_random_llama else args.base_model
        print(
            f"trl_train: check: {counts['sft']} SFT conversations, {counts['dpo']} DPO pairs; "
            f"would train {'+'.join(phases)} from {base} into {args.output_dir}",
            flush=True,
        )
        return
    os.makedirs(args.output_dir, exist_ok=True)
    model_path = args.base_model
    if args.tiny_random_llama:
        model_path = build_tiny_llama(args, os.path.join(args.output_dir, "tiny-random-llama"))
    if args.export_gguf and (args.tiny_random_llama or not args.base_model.endswith(".gguf")):
        sys.exit("trl_train: --export-gguf needs a GGUF --base-model (the export's template: metadata, tokenizer, tensor list)")
    log(f"base model {model_path}; phases {phases}")
    start = model_path
    if model_path.endswith(".gguf"):
        # Trainers refuse a model loaded from GGUF (transformers marks it quantized): the base
        # is dequantized once into a plain checkpoint, <output-dir>/base, and trained from there.
        import hashlib

        digest = file_digest(args.base_model)
        key = hashlib.sha256(json.dumps({"base": digest, "export": args.export_gguf}).encode()).hexdigest()
        hf_base = os.path.join(args.output_dir, "base")
        m = finished(args, "base", key)
        if m:
            log(f"base: dequantized earlier into {hf_base}")
            complete(args, "base", key, m["path"], None, None, m.get("gguf"))
        else:
            model, tokenizer = load(args.base_model)
            # Dequantized already: a plain float32 model from here on.
            model.hf_quantizer = None
            model.is_quantized = False
            model.config.__dict__.pop("quantization_config", None)
            model.save_pretrained(hf_base)
            tokenizer.save_pretrained(hf_base)
            del model
            log(f"base: {args.base_model} dequantized into {hf_base}")
            # The base through the same round trip as the trained models (dequantized, then
            # stored as --export-gguf), so the three compare at one precision.
            gguf = export_gguf(args, "base", checkpoint=hf_base) if args.export_gguf else None
            complete(args, "base", key, hf_base, None, None, gguf)
        model_path, start = hf_base, key
    for phase in phases:
        key = phase_key(args, phase, start)
        m = finished(args, phase, key)
        if m:
            log(f"{phase}: finished earlier with the same data and settings ({marker_path(args, phase)}), not trained again")
            complete(args, phase, key, m["path"], m["step"], m["metrics"], m.get("gguf"), m.get("progress") or [])
            model_path = m["path"]
        else:
            trained = train_sft(args, model_path) if phase == "sft" else train_dpo(args, model_path)
            model_path, step, metrics = trained
            gguf = export_gguf(args, phase, checkpoint=model_path) if args.export_gguf else None
            complete(args, phase, key, model_path, step, metrics, gguf)
        start = key
    log(f"done: final model in {model_path}")


if __name__ == "__main__":
    main()
