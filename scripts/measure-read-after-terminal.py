#!/usr/bin/env python3
"""Reads that must agree with the event stream (BENCHMARKS.md, Cluster): once a client has read
an execution's terminal event, its status and result reads must show that execution finished.

Each of CLIENTS threads runs EXECUTIONS executions one after another against a running
deployment: submit, read `GET /v1/executions/{id}/events` up to its terminal frame, then at once
`GET /v1/executions/{id}` and `GET /v1/executions/{id}/result`. A status read that shows a
non-terminal status, or a result read that answers anything but 200, contradicts the stream the
client has just read. Prints the counts as one JSON line and exits 1 if any read was wrong.

    scripts/cluster.sh up --workers 1        # 3 NATS nodes R3, 2 gateways behind HAProxy
    scripts/measure-read-after-terminal.py http://127.0.0.1:4320

Every request opens its own connection, so HAProxy spreads the reads of one execution over
both gateways (and so over the NATS nodes they are connected to). Environment: CLIENTS (8),
EXECUTIONS (100 per client), API_KEY (a bearer token, when the deployment requires one).
"""
import http.client, json, os, sys, time, urllib.parse
from concurrent.futures import ThreadPoolExecutor

base = urllib.parse.urlsplit(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:4320")
CLIENTS = int(os.environ.get("CLIENTS", 8))
EXECUTIONS = int(os.environ.get("EXECUTIONS", 100))
HEADERS = {"content-type": "application/json"}
if os.environ.get("API_KEY"):
    HEADERS["authorization"] = f"Bearer {os.environ['API_KEY']}"
TERMINAL_EVENTS = {"execution.completed", "execution.failed"}
TERMINAL_STATUSES = {"succeeded", "failed", "cancelled"}
REQUEST = json.dumps({"ability": "text-generation", "input": [{"type": "text", "text": "hi"}],
                      "deadline_ms": 60_000}).encode()


def request(method, path, body=None):
    """One request on a connection of its own; returns (status, body bytes)."""
    conn = http.client.HTTPConnection(base.hostname, base.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=HEADERS)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def terminal_event(eid):
    """Reads the execution's event stream until its terminal frame; returns its type."""
    conn = http.client.HTTPConnection(base.hostname, base.port, timeout=60)
    try:
        conn.request("GET", f"/v1/executions/{eid}/events", headers=HEADERS)
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"GET /events answered {response.status}")
        while True:
            line = response.readline()
            if not line:
                raise RuntimeError("event stream ended before its terminal frame")
            if line.startswith(b"data:"):
                kind = json.loads(line[5:]).get("type")
                if kind in TERMINAL_EVENTS:
                    return kind
    finally:
        conn.close()


def client(_):
    counts = {"executions": 0, "stale_status": 0, "result_not_200": 0, "errors": 0}
    statuses = {}
    for _ in range(EXECUTIONS):
        try:
            status, body = request("POST", "/v1/executions", REQUEST)
            if status != 202:
                raise RuntimeError(f"submit answered {status}")
            eid = json.loads(body)["execution_id"]
            terminal_event(eid)
            status, body = request("GET", f"/v1/executions/{eid}")
            shown = json.loads(body).get("status") if status == 200 else f"http {status}"
            result, _ = request("GET", f"/v1/executions/{eid}/result")
        except Exception as error:  # counted, and the run goes on: a failure is a finding too
            counts["errors"] += 1
            statuses[f"error: {error}"] = statuses.get(f"error: {error}", 0) + 1
            continue
        counts["executions"] += 1
        if shown not in TERMINAL_STATUSES:
            counts["stale_status"] += 1
            statuses[shown] = statuses.get(shown, 0) + 1
        if result != 200:
            counts["result_not_200"] += 1
    return counts, statuses


started = time.time()
with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
    results = list(pool.map(client, range(CLIENTS)))
totals = {key: sum(r[0][key] for r in results) for key in results[0][0]}
wrong = {}
for _, statuses in results:
    for shown, n in statuses.items():
        wrong[shown] = wrong.get(shown, 0) + n
print(json.dumps({"url": sys.argv[1] if len(sys.argv) > 1 else base.geturl(), "clients": CLIENTS,
                  **totals, "wrong_statuses": wrong, "seconds": round(time.time() - started, 1)}))
sys.exit(1 if totals["stale_status"] or totals["result_not_200"] or totals["errors"] else 0)
