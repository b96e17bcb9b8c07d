#!/usr/bin/env python3
"""The Python reference stack on a pairs file, for BENCHMARKS.md (metrics throughput):
BLEU (evaluate's glue over sacrebleu's 13a tokenizer + nmt compute_bleu), ROUGE
(rouge_score, Porter stemmer), METEOR (NLTK single_meteor_score over word_tokenize, WordNet
3.0 from /usr/share/wordnet) - the same code the parity fixtures are computed with
(tests/fixtures/eval/reference_*.py) - and, with --bertscore-model DIR, BERTScore
(bert_score 0.3.13 with that Hugging Face model directory, last layer, no idf, batch 64,
as reference_bertscore.py; needs torch). Prints one JSON line.

    python3 -m venv /tmp/evalvenv && /tmp/evalvenv/bin/pip install sacrebleu==2.6.0 rouge-score==0.1.2 nltk==3.10.4
    /tmp/evalvenv/bin/python benches/metrics_python.py PAIRS.jsonl
    # BERTScore too (the venv of reference_bertscore.py plus the three packages above):
    /tmp/bsvenv/bin/python benches/metrics_python.py PAIRS.jsonl --bertscore-model DIR [--skip-string-metrics]
"""
import argparse
import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fixtures", "eval"))

import reference_bleu_rouge as rb  # noqa: E402
import reference_meteor as rm  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pairs")
    ap.add_argument("--bertscore-model")
    ap.add_argument("--skip-string-metrics", action="store_true")
    args = ap.parse_args()
    pairs = [json.loads(line) for line in open(args.pairs, encoding="utf-8") if line.strip()]
    result = {"bench": "metrics-python", "pairs": len(pairs)}
    if not args.skip_string_metrics:
        result.update(string_metrics(pairs))
    if args.bertscore_model:
        result.update(bertscore(pairs, args.bertscore_model))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["peak_rss_mib"] = round(rss, 1)
    print(json.dumps(result))


def bertscore(pairs, model_dir):
    t0 = time.perf_counter()
    import bert_score
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    scorer = bert_score.BERTScorer(model_type=model_dir, num_layers=6, idf=False, batch_size=64, device="cpu")
    setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    scorer.score([p["response"] for p in pairs], [p["reference"] for p in pairs], batch_size=64)
    score = time.perf_counter() - t1
    return {"bertscore_setup_seconds": round(setup, 3), "bertscore_score_seconds": round(score, 3)}


def string_metrics(pairs):
    t0 = time.perf_counter()
    bleu, rouge = rb.make_bleu(), rb.make_rouge(documented_order=False)
    from nltk import word_tokenize
    from nltk.translate import meteor_score

    wn = rm.wordnet_reader("/usr/share/wordnet")
    rm.use_punkt(None)
    wn.synsets("dog")  # load the WordNet index, as a first call would
    setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    for p in pairs:
        bleu(p["response"], p["reference"])
        rouge(p["response"], p["reference"])
        meteor_score.single_meteor_score(
            word_tokenize(p["reference"]), word_tokenize(p["response"]), wordnet=wn, alpha=0.9, beta=3, gamma=0.5
        )
    score = time.perf_counter() - t1
    return {"setup_seconds": round(setup, 3), "score_seconds": round(score, 3), "total_seconds": round(setup + score, 3),
            "pairs_per_second": round(len(pairs) / score, 1)}


if __name__ == "__main__":
    main()
