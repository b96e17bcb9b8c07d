#!/usr/bin/env python3
"""datatrove's MinHash deduplication (signatures → buckets → clusters → filter) on the
benchmark's dialogues, with the parameters synth's `dedup` uses: 5-gram shingles, 14 buckets ×
8 hashes, seed 1. Prints the dialogues kept and removed.

    python3 benches/dedup_datatrove.py /tmp/dedup/parts /tmp/dedup/datatrove WORKERS

The input is a folder of JSONL files: datatrove reads a file per task, so the benchmark splits
the dialogues into one file per worker (both cores work, as synth's stage does). Workers are
forked (not datatrove's default forkserver) so that /usr/bin/time counts their CPU and memory.
"""

import sys

from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
from datatrove.pipeline.dedup.minhash import MinhashConfig
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter


def main():
    data, work, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2
    cfg = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, seed=1)

    def reader():
        return JsonlReader(data, glob_pattern="*.jsonl", text_key="text", id_key="id")

    LocalPipelineExecutor(
        pipeline=[reader(), MinhashDedupSignature(output_folder=f"{work}/signatures", config=cfg)],
        tasks=workers, workers=workers, logging_dir=f"{work}/logs/1", skip_completed=False, start_method="fork",
    ).run()
    LocalPipelineExecutor(
        pipeline=[MinhashDedupBuckets(input_folder=f"{work}/signatures", output_folder=f"{work}/buckets", config=cfg)],
        tasks=cfg.num_buckets, workers=workers, logging_dir=f"{work}/logs/2", skip_completed=False, start_method="fork",
    ).run()
    LocalPipelineExecutor(
        pipeline=[MinhashDedupCluster(input_folder=f"{work}/buckets", output_folder=f"{work}/remove_ids", config=cfg)],
        tasks=1, workers=1, logging_dir=f"{work}/logs/3", skip_completed=False, start_method="fork",
    ).run()
    LocalPipelineExecutor(
        pipeline=[
            reader(),
            MinhashDedupFilter(input_folder=f"{work}/remove_ids", exclusion_writer=JsonlWriter(f"{work}/removed")),
            JsonlWriter(f"{work}/kept"),
        ],
        tasks=workers, workers=workers, logging_dir=f"{work}/logs/4", skip_completed=False, start_method="fork",
    ).run()


if __name__ == "__main__":
    main()
