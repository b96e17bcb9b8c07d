#!/usr/bin/env bash
# Sharded runs of the offline RoleMRC pipeline (BENCHMARKS.md, "Sharded runs"): the
# arguments of benches/rolemrc_scale.sh, run
#   - in one process (the baseline), then with --shards 1, 2, 4 --executor local on a
#     local output directory;
#   - with --shards 2 and the state on file:// (the object-store code on local disk) and
#     on an S3 server (moto on 127.0.0.1, installed by .ci/setup-sharding).
# For each: wall and CPU seconds (/usr/bin/time), the object-store traffic the run
# prints, and a byte comparison of every output with the one-process run.
# Data first (any size; BENCHMARKS.md says which):
#   python3 pipelines/data/rolemrc-demo/generate.py --personas 10500 --records 100000 --mix 0 --out /tmp/shard-bench-data
#   benches/shard_scale.sh /tmp/shard-bench-data [SHARD COUNTS...]     (SYNTH=path picks another binary,
#   S3=0 leaves out the S3 server runs)
set -euo pipefail
D=${1:-/tmp/shard-bench-data}
shift || true
counts=("${@:-1 2 4}")
cd "$(dirname "$0")/.."
repo=$PWD
synth=${SYNTH:-$repo/target/release/synth}
W=$(mktemp -d /tmp/synth-shard-bench.XXXXXX)
moto_pid=
cleanup() { [ -n "$moto_pid" ] && kill "$moto_pid" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
args=(run pipelines/rolemrc.toml --offline -q
  --set "stages.personas_raw.path=\"$D/personas.jsonl\""
  --set "stages.msmarco.path=\"$D/msmarco.jsonl\""
  --set stages.personas.n=10500
  --set 'stages.plan.counts={free_chat=5000, onscene_chat=5000, answer=2000, no_answer=2000, refusal=2000, attempt=2000, multi_turn=2000, nested=1600, prioritized=2400}'
  --set 'stages.plan.test={per_task=100, nested_content=[20, 22], nested_format=[58, 58], prioritized=[22, 20]}')

source benches/lib.sh

measure "one process" "$synth" "${args[@]}" --out "$W/base"
for n in ${counts[*]}; do
  measure "--shards $n, local dir" "$synth" "${args[@]}" --out "$W/local-$n" --shards "$n" --executor local
  same "$W/base" "$W/local-$n"
done

measure "--shards 2, file:// state" "$synth" "${args[@]}" --state "file://$W/file-state" --work "$W/work-file" --shards 2 --executor local
same "$W/base" "$W/file-state"

# S3=0 skips the S3 server (moto on the same cores takes most of the time there).
if [ "${S3:-1}" = 0 ]; then exit 0; fi
.ci/setup-sharding >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
.tools/moto_server -H 127.0.0.1 -p "$port" >/dev/null 2>&1 &
moto_pid=$!
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port" && break; sleep 0.2; done
curl -s -o /dev/null -X PUT "http://127.0.0.1:$port/bench"
export AWS_ENDPOINT="http://127.0.0.1:$port" AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
measure "one process, s3:// state" "$synth" "${args[@]}" --state s3://bench/one --work "$W/work-s3-one"
measure "--shards 2, s3:// state" "$synth" "${args[@]}" --state s3://bench/two --work "$W/work-s3" --shards 2 --executor local
# Download the S3 state's outputs with a fresh mirror: a run on it is up to date and the
# files it fetches are the one-process run's.
"$synth" "${args[@]}" --state s3://bench/two --work "$W/work-s3-fresh" | grep -q "everything is up to date"
echo "  a fresh machine finds the s3:// state up to date"
