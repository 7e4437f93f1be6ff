#!/usr/bin/env python3
"""A webhook receiver for the end-to-end tests (tests/tests/webhooks.rs).

Verifies every request with the published Standard Webhooks library (`standardwebhooks`,
PyPI) and appends one JSON line per request to LOG:
  {"path", "webhook_id", "timestamp", "verified", "tampered_rejected", "status", "body"}
`tampered_rejected` says whether the same headers with one byte of the body changed fail
verification. What it answers depends on the path's first segment:
  /ok/...    200
  /flaky/... 500 to the first two attempts of each webhook-id at this path, then 200
  /gone/...  410
  /redirect/... 307 to /ok/redirected (a sender must not follow it)
  /hang/...  logs the first attempt of each webhook-id at this path at once with status
             "hang" and answers it only after 20 s (the sender gives up after 15); then 200
Usage: receiver.py PORT LOG SECRET [SECRET...]   (prints "receiver listening" when ready)
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

PORT = int(sys.argv[1])
LOG = sys.argv[2]
VERIFIERS = [Webhook(secret) for secret in sys.argv[3:]]
LOCK = threading.Lock()
ATTEMPTS = {}


def verifies(body, headers):
    for verifier in VERIFIERS:
        try:
            verifier.verify(body, headers)
            return True
        except WebhookVerificationError:
            pass
    return False


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        webhook_id = headers.get("webhook-id", "")
        verified = verifies(body, headers)
        tampered = bytearray(body)
        if tampered:
            tampered[len(tampered) // 2] ^= 0x01
        tampered_rejected = not verifies(bytes(tampered), headers)
        kind = self.path.strip("/").split("/")[0]
        with LOCK:
            key = (self.path, webhook_id)
            ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
            attempt = ATTEMPTS[key]
        hang = kind == "hang" and attempt == 1
        if hang:
            status = "hang"
        elif kind == "flaky" and attempt <= 2:
            status = 500
        elif kind == "gone":
            status = 410
        elif kind == "redirect":
            status = 307
        else:
            status = 200
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        line = json.dumps({
            "path": self.path,
            "webhook_id": webhook_id,
            "timestamp": headers.get("webhook-timestamp"),
            "content_type": headers.get("content-type"),
            "verified": verified,
            "tampered_rejected": tampered_rejected,
            "status": status,
            "body": parsed,
        })
        with LOCK:
            with open(LOG, "a", encoding="utf-8") as log:
                log.write(line + "\n")
                log.flush()
        if hang:
            time.sleep(20)
            status = 200
        self.send_response(status)
        if status == 307:
            self.send_header("location", "/ok/redirected")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


server = Server(("127.0.0.1", PORT), Handler)
print("receiver listening", flush=True)
server.serve_forever()
