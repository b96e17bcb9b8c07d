#!/usr/bin/env bash
# A real single-node Slurm running the script `synth emit slurm` writes, end to end:
# installs Debian's slurm-wlm and munge (.ci/setup-sharding --slurm; root and apt-get),
# writes a one-node slurm.conf for this machine (no cgroups: proctrack/linuxproc,
# task/none, so it also runs in a container without systemd), starts munged,
# slurmctld and slurmd, submits a 3-shard run of a small pipeline with the emitted
# script, waits for the queue to drain, compares every output with an unsharded run
# byte for byte, and stops the daemons it started.
#
#   benches/slurm_single_node.sh [WORKDIR]      (synth built: target/release/synth)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
synth=${SYNTH:-$repo/target/release/synth}
work=${1:-$(mktemp -d /tmp/synth-slurm.XXXXXX)}
mkdir -p "$work"
started=()
cleanup() {
  for pid in "${started[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
t0=$(date +%s)
.ci/setup-sharding --slurm
echo "setup: $(( $(date +%s) - t0 )) s"

host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2/1024) - 1024}' /proc/meminfo)
conf=/etc/slurm/slurm.conf
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cat > "$conf" <<EOF
# Written by synth's benches/slurm_single_node.sh: one node, no cgroups.
ClusterName=synth-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=synth Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
# Slurm 22.05 always loads a cgroup plugin; v1 is what this machine mounts, and nothing
# is constrained (CgroupAutomount=no, no Constrain*), so it only reads it.
cat > /etc/slurm/cgroup.conf <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
EOF

# munge: a key, then the daemon as its own user.
if [ ! -s /etc/munge/munge.key ]; then
  (command -v mungekey >/dev/null && mungekey --create --force) || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
  runuser -u munge -- /usr/sbin/munged
fi
munge -n | unmunge >/dev/null

if ! pgrep -x slurmctld >/dev/null; then
  slurmctld -D -c >/var/log/slurm/slurmctld.out 2>&1 &
  started+=($!)
fi
if ! pgrep -x slurmd >/dev/null; then
  slurmd -D >/var/log/slurm/slurmd.out 2>&1 &
  started+=($!)
fi
for _ in $(seq 60); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qE 'idle|mix|alloc'; then break; fi
  sleep 1
done
sinfo
echo "slurm up: $(( $(date +%s) - t0 )) s"

# A small pipeline: source -> llm (offline) -> filter -> embed (hashing) -> sample -> export,
# and the exact retrieval of the sample against every vector (its corpus split among the shards)
# -> metrics (rows split) of the answers against the retrieved text.
cd "$work"
cat > p.toml <<'EOF'
[pipeline]
name = "slurm-demo"
seed = 4
output_dir = "out"
[providers.local]
kind = "offline"
model = "offline"
[embedders.hash]
kind = "hashing"
dim = 16
[stages.people]
kind = "source"
path = "people.jsonl"
[stages.answers]
kind = "llm"
inputs = ["people"]
provider = "local"
prompt = "prompt.j2"
keep_columns = ["age"]
[stages.adults]
kind = "filter"
inputs = ["answers"]
where = "age >= 18"
[stages.vectors]
kind = "embed"
inputs = ["adults"]
embedder = "hash"
template = "{{ text }}"
[stages.picked]
kind = "sample"
inputs = ["vectors"]
fraction = 0.5
[stages.export]
kind = "jsonl"
inputs = ["picked"]
[stages.nearest]
kind = "retrieve"
inputs = ["picked", "vectors"]
[stages.scores]
kind = "metrics"
inputs = ["nearest"]
response = "text"
reference = "most_text"
metrics = ["bleu", "rouge"]
EOF
python3 -c 'import json
for i in range(2000): print(json.dumps({"name": f"p{i}", "age": i % 90}))' > people.jsonl
echo 'One line for {{ name }} ({{ age }}).' > prompt.j2
"$synth" run p.toml --out reference -q
"$synth" emit slurm p.toml --shards 3 --out-dir "$work/state" --synth "$synth" --time 10 -o submit.sh
t1=$(date +%s)
bash submit.sh
for _ in $(seq 600); do
  if [ -z "$(squeue -h)" ]; then break; fi
  sleep 1
done
echo "jobs done: $(( $(date +%s) - t1 )) s"
sacct -n 2>/dev/null | head -20 || true
"$synth" status state
ok=1
for f in $(cd reference && find . -type f -not -path './_synth/*' -not -name manifest.json | sort); do
  if ! cmp -s "reference/$f" "state/$f"; then echo "DIFFERS: $f"; ok=0; fi
done
if [ $ok = 1 ]; then
  echo "SLURM OK: every output of the 3-shard Slurm run equals the unsharded run's ($(cd reference && find . -type f -not -path './_synth/*' -not -name manifest.json | wc -l) files)"
else
  echo "SLURM FAILED: see $work/slurm-logs"; exit 1
fi
