#!/usr/bin/env python3
"""Write the official CharacterBench prompt templates used by synth into this folder, from
the verbatim dump `characterbench_prompts.md` (spec; every block is the Python string value
of a constant of thu-coai/CharacterBench @ f4ec56a4, with its leading/trailing newline
counts and sha256). Each file is checked against the sha256 the dump lists; a mismatch
stops the script. Usage:

    python3 pipelines/prompts/characterbench/extract_from_spec.py ../shared/specs/characterbench_prompts.md

Only the templates the pipeline needs are written (role-play zh/en, the 13 x 2 judge
prompts); the unused `*_Guideline` variants are not.
"""
import hashlib
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def blocks(text):
    """(heading, meta line, template) for every fenced block."""
    lines = text.split("\n")
    out, i, heading, meta = [], 0, None, None
    while i < len(lines):
        line = lines[i]
        if line.startswith("### "):
            heading, meta = line[4:], None
        elif "sha256=" in line and heading:
            meta = line
        elif line.startswith("~~~~") and meta:
            j = i + 1
            while not lines[j].startswith("~~~~"):
                j += 1
            body = "\n".join(lines[i + 1 : j]).strip("\n")
            lead = int(re.search(r"lead_nl=(\d+)", meta).group(1))
            trail = int(re.search(r"trail_nl=(\d+)", meta).group(1))
            sha = re.search(r"sha256=`([0-9a-f]{64})`", meta).group(1)
            template = "\n" * lead + body + "\n" * trail
            out.append((heading, sha, template))
            heading, meta, i = None, None, j
        i += 1
    return out


def main():
    spec = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "../../../../shared/specs/characterbench_prompts.md")
    text = open(spec, encoding="utf-8").read()
    written = 0
    for heading, sha, template in blocks(text):
        if "(guideline)" in heading:
            continue
        if heading.startswith("`Role_Play_PROMPT_"):
            lang = heading.strip("`").rsplit("_", 1)[1].lower()
            path = f"roleplay/{lang}.txt"
        else:
            m = re.match(r"(\w+) — (zh|en) — `[^`]*::(\w+)`", heading)
            if not m:
                continue
            dim, lang, const = m.groups()
            name = "morality" if dim.startswith("morality_") else dim
            path = f"judge/{lang}/{name}.txt"
        got = hashlib.sha256(template.encode("utf-8")).hexdigest()
        if got != sha:
            sys.exit(f"{heading}: sha256 {got} != {sha} listed in {spec}")
        full = os.path.join(HERE, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8", newline="") as f:
            f.write(template)
        print(f"{sha}  {path}")
        written += 1
    print(f"{written} templates written", file=sys.stderr)


if __name__ == "__main__":
    main()
