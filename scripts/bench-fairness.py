#!/usr/bin/env python3
"""Fairness across tenants (BENCHMARKS.md, Scaling): how long a light tenant's executions wait
in the queue while a heavy tenant's backlog fills every slot.

Tenant `heavy` submits BACKLOG one-second executions at once; tenant `light` then submits one
execution a second for DURATION seconds. A mock provider holds each call HOLD_MS with SLOTS
slots in all. An execution's queue wait is the time from its `execution.accepted` event to its
`route.selected` event (the worker claimed it and picked a provider). Prints the waits of both
tenants (p50, p99, max) as one JSON line.

    scripts/bench-fairness.py embedded target/release/gateway
    scripts/bench-fairness.py nats target/release/gateway target/release/worker

`nats` starts nats-server (MRT_NATS_SERVER or PATH) and redis-server on free ports and one worker.
Environment: BACKLOG (2000), DURATION (20), SLOTS (64), HOLD_MS (1000).
"""
import datetime, hashlib, json, os, socket, subprocess, sys, tempfile, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

mode, gateway = sys.argv[1], sys.argv[2]
worker = sys.argv[3] if mode == "nats" else None
BACKLOG = int(os.environ.get("BACKLOG", 2000))
DURATION = int(os.environ.get("DURATION", 20))
SLOTS = int(os.environ.get("SLOTS", 64))
HOLD_MS = int(os.environ.get("HOLD_MS", 1000))
KEYS = {t: f"mrt-fairness-bench-{t}-0123456789abcdef0123456789abcdef" for t in ("heavy", "light")}

config = {
    "providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                   "abilities": ["text-generation"], "chunks": ["done"], "delay_ms": HOLD_MS,
                   "max_concurrency": SLOTS, "max_queue_depth": 4 * SLOTS}],
    "max_active_executions": BACKLOG + 4 * DURATION + 64,
    "auth": {"tenants": {"heavy": {}, "light": {}},
             "keys": [{"id": f"{t}-key", "tenant": t, "sha256": hashlib.sha256(k.encode()).hexdigest(),
                       "scopes": ["submit", "read", "cancel"]} for t, k in KEYS.items()]},
}
work = tempfile.mkdtemp(prefix="mrt-fairness-")
path = os.path.join(work, "deployment.json")
json.dump(config, open(path, "w"))
procs = []


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close(); return port


def start(cmd, env, marker=None):
    log = open(os.path.join(work, os.path.basename(cmd[0]) + f"-{len(procs)}.log"), "w")
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if marker else log, stderr=log, text=True)
    procs.append(p)
    if marker:
        while True:
            line = p.stdout.readline()
            if not line:
                sys.exit(f"{cmd[0]} exited; see {work}")
            if marker in line:
                return line.split(marker)[1].strip()


env = dict(os.environ, MODEL_RUNTIME_CONFIG=path, RUST_LOG="warn")
try:
    if mode == "nats":
        nats_port, redis_port = free_port(), free_port()
        start([os.environ.get("MRT_NATS_SERVER", "nats-server"), "-js", "-a", "127.0.0.1", "-p", str(nats_port),
               "-sd", os.path.join(work, "js")], env)
        start(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"], env)
        time.sleep(1.0)
        env.update(MODEL_RUNTIME_BACKEND="nats", NATS_URL=f"nats://127.0.0.1:{nats_port}",
                   REDIS_URL=f"redis://127.0.0.1:{redis_port}", MODEL_RUNTIME_NAMESPACE="fair",
                   MODEL_RUNTIME_ADMIN_PORT="0")
    url = start([gateway, "--port", "0"], env, "listening on ")
    if worker:
        start([worker], env, "worker started")

    def call(method, route, tenant, body=None):
        req = urllib.request.Request(url + route, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"authorization": f"Bearer {KEYS[tenant]}", "content-type": "application/json"})
        return json.load(urllib.request.urlopen(req, timeout=600))

    request = {"ability": "text-generation", "input": [{"type": "text", "text": "hi"}],
               "deadline_ms": 600_000}

    def submit(tenant):
        return call("POST", "/v1/executions", tenant, request)["execution_id"]

    def seconds(stamp):
        # Event times are RFC 3339 UTC with milliseconds ("2026-12-04T21:00:00.123Z").
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    def wait_of(tenant, eid):
        while True:
            with urllib.request.urlopen(urllib.request.Request(
                    f"{url}/v1/executions/{eid}/events",
                    headers={"authorization": f"Bearer {KEYS[tenant]}"}), timeout=900) as r:
                times = {}
                for raw in r:
                    line = raw.decode().strip()
                    if line.startswith("data:"):
                        e = json.loads(line[5:])
                        times.setdefault(e["type"], e["time"])
                        if e["type"] == "route.selected":
                            break
                if "route.selected" in times:
                    return seconds(times["route.selected"]) - seconds(times["execution.accepted"])

    pool = ThreadPoolExecutor(max_workers=64)
    t0 = time.time()
    heavy = list(pool.map(lambda _: submit("heavy"), range(BACKLOG)))
    submitted = time.time() - t0
    light = []
    for i in range(DURATION):
        light.append(submit("light"))
        time.sleep(max(0.0, t0 + submitted + i + 1 - time.time()))
    light_waits = sorted(pool.map(lambda e: wait_of("light", e), light))
    sample = heavy[:: max(1, len(heavy) // 200)]
    heavy_waits = sorted(pool.map(lambda e: wait_of("heavy", e), sample))

    def pct(xs, q):
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)

    print(json.dumps({"mode": mode, "backlog": BACKLOG, "slots": SLOTS, "hold_ms": HOLD_MS,
                      "cores": os.cpu_count(), "backlog_submit_s": round(submitted, 2),
                      "light": {"n": len(light_waits), "p50": pct(light_waits, .5), "p99": pct(light_waits, .99), "max": round(light_waits[-1], 3)},
                      "heavy_sample": {"n": len(heavy_waits), "p50": pct(heavy_waits, .5), "max": round(heavy_waits[-1], 3)}}))
finally:
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
