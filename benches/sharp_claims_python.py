"""The obvious Python peers of `sharp_claims` (BENCHMARKS.md, benches/sharp_claims.sh): the same
filtering of a ConceptNet assertions dump (gzip, 5 tab-separated columns) — both ends English, the
spec's 17 relations, weight >= 1, a surface text — then dedupe on the assertion URI, claims rendered
from the surface text, a seeded sample. `--engine pandas`: pandas.read_csv in chunks of 1M rows
(loading the whole 10 GB at once does not fit in memory), vectorised column filters, json.loads on
the rows left. `--engine csv`: the standard library's csv reader, row by row. Neither checks the JSON
of rows the cheap filters drop (synth does by default; `check_json = "kept"` matches them).
Prints one JSON line: rows read, claims kept, the sample size."""
import argparse
import csv
import gzip
import json
import random
import sys

RELATIONS = [
    "IsA", "UsedFor", "AtLocation", "CapableOf", "HasProperty", "PartOf", "HasA", "Causes", "Desires",
    "MadeOf", "HasSubevent", "HasPrerequisite", "ReceivesAction", "CreatedBy", "MotivatedByGoal",
    "CausesDesire", "LocatedNear",
]
REL_URIS = {"/r/" + r for r in RELATIONS}


def lang(node):
    parts = node.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "c" else None


def render(surface):
    return surface.replace("[[", "").replace("]]", "").strip().lstrip("*").strip()


def keep(info_text, min_weight):
    info = json.loads(info_text)
    if info.get("weight", 0) < min_weight:
        return None
    surface = info.get("surfaceText")
    if not surface:
        return None
    claim = render(surface)
    return claim or None


def with_csv(path, min_weight):
    rows, kept, seen = 0, [], set()
    csv.field_size_limit(sys.maxsize)
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            rows += 1
            if len(row) != 5:
                continue
            uri, rel, start, end, info = row
            if rel not in REL_URIS or lang(start) != "en" or lang(end) != "en":
                continue
            claim = keep(info, min_weight)
            if claim is None or uri in seen:
                continue
            seen.add(uri)
            kept.append((uri, rel, claim))
    return rows, kept


def with_pandas(path, min_weight):
    import pandas as pd

    rows, kept, seen = 0, [], set()
    names = ["uri", "rel", "start", "end", "info"]
    chunks = pd.read_csv(
        path, sep="\t", header=None, names=names, dtype=str, quoting=csv.QUOTE_NONE,
        compression="gzip", chunksize=1_000_000, engine="c", na_filter=False,
    )
    for chunk in chunks:
        rows += len(chunk)
        mask = chunk["rel"].isin(REL_URIS) & chunk["start"].str.startswith("/c/en/") & chunk["end"].str.startswith("/c/en/")
        sub = chunk[mask]
        claims = sub["info"].map(lambda t: keep(t, min_weight))
        sub = sub.assign(claim=claims)[claims.notna()]
        for uri, rel, claim in zip(sub["uri"], sub["rel"], sub["claim"]):
            if uri not in seen:
                seen.add(uri)
                kept.append((uri, rel, claim))
    return rows, kept


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--engine", choices=["pandas", "csv"], required=True)
    ap.add_argument("--sample", type=int, default=1000)
    ap.add_argument("--min-weight", type=float, default=1.0)
    a = ap.parse_args()
    rows, kept = (with_pandas if a.engine == "pandas" else with_csv)(a.path, a.min_weight)
    sample = random.Random(7).sample(kept, min(a.sample, len(kept)))
    print(json.dumps({"engine": a.engine, "rows": rows, "claims": len(kept), "sample": len(sample)}))


if __name__ == "__main__":
    main()
