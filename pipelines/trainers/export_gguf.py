#!/usr/bin/env python3
"""Export a fine-tuned checkpoint to GGUF, so synth's `local` provider (llama.cpp) can run it.

    python3 pipelines/trainers/export_gguf.py --template base.gguf --checkpoint out/train/sft \
        --out out/train/sft.gguf --type q8_0

The checkpoint was trained from a GGUF (`trl_train.py --base-model X.gguf`: transformers
dequantized it). The export is that load run backwards, with the base GGUF as the template:

- every metadata key of the template is copied as it is (architecture hyperparameters,
  the tokenizer and its vocabulary, the chat template), except `general.file_type`, which
  names the new tensor type; so the exported model tokenizes and formats chats exactly as
  the base did;
- every tensor of the template is taken from the checkpoint by gguf-py's name map
  (HF `model.layers.3.self_attn.q_proj.weight` → `blk.3.attn_q.weight`), with llama.cpp's
  row permutation of the Q and K projections put back (transformers undoes it on load);
  1-D tensors (norms) stay F32, the others are stored as `--type` (f32, f16, q8_0, q4_0,
  q4_1, q5_0, q5_1; `same` keeps each tensor's type in the template).

It is an equivalent of llama.cpp's convert_hf_to_gguf.py for the architectures listed in
SUPPORTED (the models synth's local provider is tested with), chosen because that converter
is not on PyPI, needs the HF tokenizer files (a GGUF-loaded checkpoint has them only as
transformers rebuilt them) and would re-derive the vocabulary; this keeps the base's bytes.
`--verify` (used for the untrained base) checks that every tensor the export would write,
before quantization, equals the template's tensor dequantized: a wrong name or permutation
fails there instead of producing a model that talks nonsense.

Errors name the file: a checkpoint folder without weights, a template of another
architecture, a tensor the checkpoint lacks or has in another shape. Exit status 1.
Requires numpy, gguf (gguf-py, >= 0.10) and, for checkpoints, safetensors + torch.
"""

import argparse
import glob
import json
import os
import sys

SUPPORTED = ("llama",)
TYPES = ("same", "f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


class ExportError(Exception):
    pass


def _field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def permute(weights, n_head, n_head_kv):
    """llama.cpp's row order of a Q/K projection (convert_hf_to_gguf.LlamaModel.permute)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def load_checkpoint(directory):
    """name → float32 numpy array of a transformers checkpoint folder (safetensors)."""
    if not os.path.isdir(directory):
        raise ExportError(f"{directory}: not a checkpoint folder")
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    if not files:
        present = ", ".join(sorted(os.listdir(directory))) or "nothing"
        raise ExportError(
            f"{directory}: no weights (expected model.safetensors or model-*.safetensors; found {present})"
        )
    import torch
    from safetensors.torch import load_file

    state = {}
    for path in files:
        try:
            for name, t in load_file(path).items():
                state[name] = t.to(torch.float32).numpy()
        except Exception as e:  # a truncated or foreign file
            raise ExportError(f"{path}: cannot read the weights: {e}") from e
    return state


def check_template(template):
    """The template's reader and architecture, or an ExportError naming the file."""
    import gguf

    try:
        reader = gguf.GGUFReader(template)
    except Exception as e:
        raise ExportError(f"{template}: not a readable GGUF file: {e}") from e
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED:
        raise ExportError(
            f"{template}: architecture {arch!r} is not supported by the export (supported: {', '.join(SUPPORTED)})"
        )
    return reader, arch


def export(template, state, out, qtype="q8_0", verify=False, source="the checkpoint"):
    """Write `out` from `template`'s metadata and `state`'s tensors. Returns the tensor count."""
    import numpy as np
    import gguf

    if qtype not in TYPES:
        raise ExportError(f"--type {qtype}: not one of {', '.join(TYPES)}")
    reader, arch = check_template(template)
    n_blocks = _field(reader, f"{arch}.block_count")
    n_head = _field(reader, f"{arch}.attention.head_count")
    n_head_kv = _field(reader, f"{arch}.attention.head_count_kv") or n_head
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_blocks)

    # GGUF name → HF name, over the checkpoint's tensors.
    by_gguf = {}
    for hf_name in state:
        g = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if g is not None:
            by_gguf[g] = hf_name

    Q = gguf.GGMLQuantizationType
    wanted = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1, "q5_0": Q.Q5_0, "q5_1": Q.Q5_1}
    file_types = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
        "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
        "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
        "q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
    }

    tmp = out + ".partial"
    writer = gguf.GGUFWriter(tmp, arch)
    for field in reader.fields.values():
        key = field.name
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type" and qtype != "same":
            writer.add_file_type(file_types[qtype])
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)

    count = 0
    for t in reader.tensors:
        hf_name = by_gguf.get(t.name)
        if hf_name is None:
            raise ExportError(f"{source}: no tensor for {t.name} of {template} (looked for it by gguf-py's {arch} name map)")
        data = np.ascontiguousarray(state[hf_name], dtype=np.float32)
        if t.name.endswith("attn_q.weight"):
            data = permute(data, n_head, n_head)
        elif t.name.endswith("attn_k.weight"):
            data = permute(data, n_head, n_head_kv)
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # GGUF lists dimensions innermost first
        if data.shape != shape:
            raise ExportError(f"{source}: {hf_name} has shape {data.shape}, {template}'s {t.name} has {shape}")
        if verify:
            base = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
            diff = float(np.max(np.abs(base.astype(np.float32) - data))) if data.size else 0.0
            if diff != 0.0:
                raise ExportError(f"{source}: {hf_name} differs from {template}'s {t.name} by up to {diff} (wrong mapping?)")
        target = t.tensor_type if qtype == "same" else wanted[qtype]
        if data.ndim == 1 or target == Q.F32:
            writer.add_tensor(t.name, data.astype(np.float32))
        elif target == Q.F16:
            writer.add_tensor(t.name, data.astype(np.float16))
        else:
            block = gguf.GGML_QUANT_SIZES[target][0]
            if data.shape[-1] % block:
                writer.add_tensor(t.name, data.astype(np.float16))
            else:
                writer.add_tensor(t.name, gguf.quants.quantize(data, target), raw_dtype=target)
        count += 1

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
    return count


def main(argv=None):
    p = argparse.ArgumentParser(description="export a checkpoint trained from a GGUF back to GGUF")
    p.add_argument("--template", required=True, help="the base model's GGUF (metadata, tokenizer, tensor list)")
    p.add_argument("--checkpoint", required=True, help="a transformers checkpoint folder (safetensors)")
    p.add_argument("--out", required=True, help="the GGUF file to write")
    p.add_argument("--type", default="q8_0", choices=TYPES)
    p.add_argument("--verify", action="store_true", help="require the checkpoint to equal the template (an untrained base)")
    args = p.parse_args(argv)
    try:
        check_template(args.template)
        state = load_checkpoint(args.checkpoint)
        n = export(args.template, state, args.out, args.type, args.verify, source=args.checkpoint)
    except ExportError as e:
        sys.exit(f"export_gguf: {e}")
    print(json.dumps({"out": args.out, "tensors": n, "type": args.type}), flush=True)


if __name__ == "__main__":
    main()
