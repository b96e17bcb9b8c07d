#!/usr/bin/env bash
# RoleEval through the loopback server: synth's chat path vs lm-evaluation-harness
# (`local-chat-completions`), the same 12,000 prompts (6,000 test questions x zero- and five-shot,
# spec ../shared/specs/roleeval.md §3.1) sent to the same mock server with the same concurrency.
# Issue 15, "Benchmarks". Results and the commands used: benches/roleeval_lm_eval.md.
#
#   benches/roleeval_lm_eval.sh                  # one round: synth, then lm_eval
#   ROUNDS=2 benches/roleeval_lm_eval.sh         # synth, lm_eval, synth, lm_eval (alternating)
#   ORDER="lm_eval synth" benches/roleeval_lm_eval.sh
#
# Knobs (env): LATENCY_MS (50), CONCURRENCY (16 = the openai provider's default max_concurrency,
# which pipelines/roleeval.toml does not override), ROUNDS (1), ORDER ("synth lm_eval"),
# SERVER_SECONDS (lifetime of each mock server; it prints its request counters only when its
# lifetime ends, so the script waits for it: default 150), LIMIT (questions per file for a quick
# check: lm_eval gets LIMIT rows per file, synth the first LIMIT rows of its source; unset = all),
# WORK (outputs/bench-roleeval-lmeval, gitignored), SKIP_BUILD=1 (use target/release as it is).
#
# Prints one JSON line per client run: client, round, wall_seconds, cpu_seconds (user+sys of the
# client process tree), user_seconds, sys_seconds, max_rss_mb (largest single process), requests
# (what the server counted), ok, s429, and the client's own count of answers.
#
# Needs: ../shared/data/roleeval, python3 (3.9+) with venv and network access to PyPI for the
# first run (lm_eval goes to .tools/lmevalvenv, gitignored; no torch is pulled by lm_eval 0.4.13).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

LATENCY_MS=${LATENCY_MS:-50}
CONCURRENCY=${CONCURRENCY:-16}
ROUNDS=${ROUNDS:-1}
ORDER=${ORDER:-"synth lm_eval"}
SERVER_SECONDS=${SERVER_SECONDS:-150}
LM_EVAL_VERSION=${LM_EVAL_VERSION:-0.4.13}
DATA=${DATA:-$ROOT/../shared/data/roleeval}
WORK=${WORK:-$ROOT/outputs/bench-roleeval-lmeval}
VENV=$ROOT/.tools/lmevalvenv
TIME=/usr/bin/time

[ -d "$DATA/zh" ] || { echo "no RoleEval release at $DATA" >&2; exit 1; }
[ -x "$TIME" ] || { echo "needs GNU time at $TIME (apt-get install time)" >&2; exit 1; }
mkdir -p "$WORK"

# --- 1. lm_eval in its own venv (pinned) ------------------------------------------------------
if ! "$VENV/bin/python" -c "import lm_eval, tenacity" 2>/dev/null; then
    t0=$(date +%s)
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "lm_eval[api]==$LM_EVAL_VERSION"
    echo "lm_eval $LM_EVAL_VERSION installed in $(( $(date +%s) - t0 )) s, venv $(du -sh "$VENV" | cut -f1)" >&2
fi
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "note: torch is present in $VENV (not needed by local-chat-completions)" >&2
fi

# --- 2. binaries -------------------------------------------------------------------------------
if [ -z "${SKIP_BUILD:-}" ]; then
    nice cargo build --release --locked -q && nice cargo build --release --locked -q --bench mock_openai \
        || echo "warning: cargo build failed; using the binaries already in target/release" >&2
fi
MOCK=$(ls -t target/release/deps/mock_openai-* | grep -v '\.d$' | head -1)
SYNTH=$ROOT/target/release/synth

# --- 3. the 12,000 prompts for lm_eval, rendered by the spec's formula (§3.1), checked against
#        the spec's reference hashes here and against synth's own prompts after synth's run
TASKDIR=$WORK/tasks
mkdir -p "$TASKDIR"
"$VENV/bin/python" - "$DATA" "$TASKDIR" "${LIMIT:-}" <<'PY'
import csv, hashlib, json, sys, os
data, out, limit = sys.argv[1], sys.argv[2], sys.argv[3]
limit = int(limit) if limit else None
cats = [("celebrities", "名人"), ("anime_and_comics", "动漫角色"), ("movies_and_tv_series", "影视角色"),
        ("games", "游戏角色"), ("fiction", "小说人物")]
def rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
def block(r):
    return r["question"] + "".join(f"\n{c}. {r[c]}" for c in "ABCD") + "\n答案："
render = {}
for subset in ("global", "chinese"):
    for stem, name in cats:
        dev = rows(f"{data}/zh/{subset}/dev/{stem}_dev.csv")
        test = rows(f"{data}/zh/{subset}/test/{stem}_test.csv")
        head = f"以下是关于{name}的单项选择题，请选出其中的正确答案。\n\n"
        shots = "".join(block(d) + d["answer"] + "\n\n" for d in dev[:5])
        for r in test[:limit]:
            key = f"{subset}/{stem}/{r['id']}"
            render[(key, 0)] = head + block(r)
            render[(key, 5)] = head + shots + block(r)
sha = lambda s: hashlib.sha256(s.encode("utf-8")).hexdigest()
expected = {("global/celebrities/48", 0): "97647daee5bf6a1554acb1c48a5a988c3991bf7cdde2196f6961dbeff3f71d77",
            ("global/celebrities/48", 5): "df694dd0f1b79086709f6e9a9e48b5271a531e42f3f9755123aeb505a28cf44c",
            ("chinese/fiction/0", 0): "fb6e1a550ea0a959aaff5ebdc2ae4bce3bdc2f4c9c7b03281a0a1888e4733963",
            ("chinese/fiction/0", 5): "d87479fbb98eb3a2db85139269ed967dd1a533e49566510e88d52880d994f6b4"}
for k, h in expected.items():
    if k in render:
        assert sha(render[k]) == h, f"rendering of {k} differs from the spec's reference"
for k in (0, 5):
    with open(f"{out}/roleeval_zh_{k}shot.jsonl", "w", encoding="utf-8") as f:
        for (key, shots), p in render.items():
            if shots == k:
                f.write(json.dumps({"id": f"{key}/{k}shot", "prompt": p, "prompt_sha256": sha(p),
                                    "answer": ""}, ensure_ascii=False) + "\n")
print(f"rendered {len(render)} prompts", file=sys.stderr)
PY

# Two generate_until tasks with synth's max_tokens (256 zero-shot, 32 five-shot), temperature 0,
# no stop sequence (synth sends none), one user message holding the whole prompt
# (--apply_chat_template, no system prompt, no description, num_fewshot 0: the five exemplars are
# already in the prompt). A letter regex stands in for the answer extraction; no answer key exists,
# so the metric is meaningless and is there because lm_eval requires one.
for k in 0 5; do
    max=$([ $k = 0 ] && echo 256 || echo 32)
    cat > "$TASKDIR/roleeval_zh_${k}shot.yaml" <<YAML
task: roleeval_zh_${k}shot
dataset_path: json
dataset_kwargs:
  data_files:
    test: $TASKDIR/roleeval_zh_${k}shot.jsonl
test_split: test
output_type: generate_until
doc_to_text: prompt
doc_to_target: answer
num_fewshot: 0
generation_kwargs:
  until: []
  max_gen_toks: $max
  temperature: 0.0
  do_sample: false
filter_list:
  - name: letter
    filter:
      - function: regex
        regex_pattern: "([ABCD])"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
YAML
done

# --- 4. runs -----------------------------------------------------------------------------------
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# GNU time's -f: wall, user, sys, max RSS (KB) of the client and its children (lm_eval's
# `datasets` may fork; max RSS is the largest single process, not the sum).
TFMT='%e %U %S %M'

run_one() { # client round
    local client=$1 round=$2 p; p=$(port)
    local base=http://127.0.0.1:$p/v1 dir=$WORK/$client-r$round
    rm -rf "$dir"; mkdir -p "$dir"
    "$MOCK" --port "$p" --latency-ms "$LATENCY_MS" --seconds "$SERVER_SECONDS" 2> "$dir/server.log" &
    local server=$!
    for _ in $(seq 50); do grep -q "mock OpenAI server" "$dir/server.log" && break; sleep 0.1; done
    local t_start; t_start=$(date +%s)
    if [ "$client" = synth ]; then
        CHAT_BASE_URL=$base CHAT_MODEL=m CHAT_API_KEY=dummy \
        OPEN_BASE_URL=$base OPEN_MODEL=m OPEN_API_KEY=dummy \
        "$TIME" -f "$TFMT" -o "$dir/time" \
            "$SYNTH" run pipelines/roleeval.toml --until chat --out "$dir/out" -q \
            --set "providers.chat.max_concurrency=$CONCURRENCY" \
            ${LIMIT:+--limit $LIMIT} > "$dir/client.log" 2>&1 || echo "synth failed: $dir/client.log" >&2
    else
        OPENAI_API_KEY=dummy HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 HF_DATASETS_CACHE=$dir/hf \
        "$TIME" -f "$TFMT" -o "$dir/time" \
            "$VENV/bin/lm_eval" --model local-chat-completions \
            --model_args "model=m,base_url=$base/chat/completions,num_concurrent=$CONCURRENCY,max_retries=3,tokenized_requests=False" \
            --apply_chat_template --tasks roleeval_zh_0shot,roleeval_zh_5shot --include_path "$TASKDIR" \
            --output_path "$dir/results" --log_samples > "$dir/client.log" 2>&1 || echo "lm_eval failed: $dir/client.log" >&2
    fi
    local t_client=$(( $(date +%s) - t_start ))
    if [ "$t_client" -ge "$SERVER_SECONDS" ]; then
        echo "warning: the client ran ${t_client}s, past the server's lifetime: raise SERVER_SECONDS" >&2
    fi
    wait "$server" || true   # the server prints its counters when its lifetime ends
    local answers
    if [ "$client" = synth ]; then
        answers=$("$VENV/bin/python" -c "import pyarrow.parquet as pq,sys; print(pq.read_metadata(sys.argv[1]).num_rows)" "$dir/out/chat.parquet" 2>/dev/null || echo null)
    else
        answers=$(cat "$dir"/results/*/samples_*.jsonl 2>/dev/null | wc -l)
    fi
    "$VENV/bin/python" - "$client" "$round" "$dir" "$answers" <<'PY'
import json, re, sys
client, rnd, d, answers = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
wall, user, sys_, rss = open(f"{d}/time").read().split()[-4:]
m = re.search(r"served (\d+) requests: (\d+) ok, (\d+) 429", open(f"{d}/server.log").read())
req, ok, s429 = (int(x) for x in m.groups()) if m else (None, None, None)
print(json.dumps({"client": client, "round": rnd, "wall_seconds": float(wall),
                  "cpu_seconds": round(float(user) + float(sys_), 2), "user_seconds": float(user),
                  "sys_seconds": float(sys_), "max_rss_mb": round(int(rss) / 1024, 1),
                  "requests": req, "ok": ok, "s429": s429,
                  "answers": None if answers == "null" else int(answers)}))
PY
}

check_prompts() { # synth's rendered prompts == the ones given to lm_eval
    "$VENV/bin/python" - "$1/out/prompts.parquet" "$TASKDIR" "${LIMIT:-}" <<'PY'
import json, sys, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1], columns=["id", "prompt_sha256", "messages"]).to_pylist()
synth = {r["id"]: r["prompt_sha256"] for r in t}
assert all(len(r["messages"]) == 1 and r["messages"][0]["role"] == "user" for r in t)
mine = {}
for k in (0, 5):
    for line in open(f"{sys.argv[2]}/roleeval_zh_{k}shot.jsonl", encoding="utf-8"):
        d = json.loads(line); mine[d["id"]] = d["prompt_sha256"]
same = sum(mine.get(k) == v for k, v in synth.items())
print(f"prompts: synth {len(synth)}, lm_eval {len(mine)}, identical {same}", file=sys.stderr)
# with LIMIT, synth takes the first LIMIT rows of its source and lm_eval LIMIT rows per file
assert same == len(synth) and (sys.argv[3] or len(mine) == len(synth)), "synth's prompts and lm_eval's differ"
PY
}

check_lm_eval_prompts() { # what lm_eval sent == the rendered prompts (one user message each)
    "$VENV/bin/python" - "$1/results" "$TASKDIR" <<'PY'
import glob, hashlib, json, sys
n = same = 0
for k in (0, 5):
    mine = [json.loads(l)["prompt"] for l in open(f"{sys.argv[2]}/roleeval_zh_{k}shot.jsonl", encoding="utf-8")]
    for path in glob.glob(f"{sys.argv[1]}/*/samples_roleeval_zh_{k}shot_*.jsonl"):
        for line in open(path, encoding="utf-8"):
            d = json.loads(line)
            a = d["arguments"]["gen_args_0"]["arg_0"]
            msgs = json.loads(a[0] if isinstance(a, list) else a)
            n += 1
            same += len(msgs) == 1 and msgs[0]["role"] == "user" and msgs[0]["content"] == mine[d["doc_id"]]
print(f"lm_eval sent {n} prompts, {same} identical to synth's", file=sys.stderr)
assert n == same
PY
}

checked=
lchecked=
for round in $(seq "$ROUNDS"); do
    for client in $ORDER; do
        run_one "$client" "$round"
        if [ "$client" = synth ] && [ -z "$checked" ]; then check_prompts "$WORK/synth-r$round"; checked=1; fi
        if [ "$client" = lm_eval ] && [ -z "$lchecked" ]; then check_lm_eval_prompts "$WORK/lm_eval-r$round"; lchecked=1; fi
    done
done
