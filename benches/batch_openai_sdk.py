"""The peer of `synth`'s batch mode in benches/batch_bench.sh: the openai Python SDK's
documented batch flow for the same N prompts (write the JSONL, files.create,
batches.create, poll batches.retrieve, files.content, parse every line by custom_id,
write the answers as JSONL). Usage: python batch_openai_sdk.py BASE_URL N OUT_DIR POLL_SECONDS"""
import json, os, sys, time

from openai import OpenAI

base_url, n, out, poll = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
os.makedirs(out, exist_ok=True)
client = OpenAI(base_url=base_url, api_key="bench")
path = os.path.join(out, "requests.jsonl")
with open(path, "w") as f:
    for i in range(n):
        prompt = f"Record records-{i}: write one sentence about item {i} and topic {i % 7}.\n"
        body = {"model": "bench-model", "messages": [{"role": "user", "content": prompt}], "stream": False}
        f.write(json.dumps({"custom_id": f"records-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
with open(path, "rb") as f:
    file = client.files.create(file=f, purpose="batch")
batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    time.sleep(poll)
    batch = client.batches.retrieve(batch.id)
answers = {}
for line in client.files.content(batch.output_file_id).text.splitlines():
    r = json.loads(line)
    answers[r["custom_id"]] = r["response"]["body"]["choices"][0]["message"]["content"]
with open(os.path.join(out, "answers.jsonl"), "w") as f:
    for i in range(n):
        f.write(json.dumps({"id": f"records-{i}", "raw": answers[f"records-{i}"]}) + "\n")
print(json.dumps({"answered": len(answers), "status": batch.status}))
