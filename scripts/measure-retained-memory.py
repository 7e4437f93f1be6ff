#!/usr/bin/env python3
"""Memory per retained execution in embedded mode (BENCHMARKS.md, Scaling).

Starts GATEWAY (a gateway binary) in embedded mode with a mock that streams 100 deltas of
4,000 characters, runs N executions one after the other (reading each event stream to its
end), keeps them, and prints the growth of the process's resident memory per execution.

    scripts/measure-retained-memory.py target/release/gateway [N=200]
"""
import json, os, subprocess, sys, time, urllib.request, tempfile
gw = sys.argv[1]; n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
chunk = "x" * 4000
cfg = {"providers": [{"type": "mock", "id": "m", "model": "model-alpha", "abilities": ["text-generation"],
        "chunks": [chunk] * 100, "delay_ms": 0, "max_concurrency": 64}], "max_active_executions": 1024}
d = tempfile.mkdtemp(); p = os.path.join(d, "c.json"); json.dump(cfg, open(p, "w"))
env = dict(os.environ, MODEL_RUNTIME_CONFIG=p, RUST_LOG="warn")
proc = subprocess.Popen([gw, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
url = proc.stdout.readline().split("listening on ")[1].strip()
def rss():
    for l in open(f"/proc/{proc.pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) * 1024
req = json.dumps({"ability": "text-generation", "input": [{"type": "text", "text": "hi"}]}).encode()
def run_one():
    r = urllib.request.urlopen(urllib.request.Request(url + "/v1/executions", data=req, headers={"content-type": "application/json", "accept": "text/event-stream"}))
    body = r.read(); return len(body)
for _ in range(20): run_one()
time.sleep(1); base = rss(); total = 0
for _ in range(n): total += run_one()
time.sleep(1); after = rss()
print(f"executions {n}; SSE bytes per execution {total//n}; RSS {base/2**20:.1f} -> {after/2**20:.1f} MiB; per execution {(after-base)/n/1024:.0f} KiB")
proc.terminate()
