#!/usr/bin/env python3
"""A tiny push endpoint to watch redrive deliver, fail and retry (Python 3, standard library only).

    python3 examples/push_endpoint.py                      # 200 to everything
    python3 examples/push_endpoint.py --fail-first 2       # 503 to the first 2 attempts of each message
    python3 examples/push_endpoint.py --fail-first 1 --status 429 --retry-after 3
    WEBHOOK_SECRET=whsec_... python3 examples/push_endpoint.py   # also verify signatures

It prints one line per request: the message id, the attempt, what it answered, the payload.
With WEBHOOK_SECRET set (the queue's push.signing_secret), it checks the Standard Webhooks
signature (webhook-id, webhook-timestamp, webhook-signature; HMAC-SHA256 over
"id.timestamp.body", base64) and answers 401 to a request whose signature does not verify,
which redrive treats as permanent (the message goes dead at once).
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_S = 5 * 60


def secret_bytes(secret):
    """The key of a `whsec_...` secret (or of a bare base64 one)."""
    if secret.startswith("whsec_"):
        secret = secret[len("whsec_"):]
    return base64.b64decode(secret)


def verify(key, headers, body):
    """Standard Webhooks v1: one of the space-separated `v1,<base64>` signatures must match."""
    msg_id = headers.get("webhook-id", "")
    ts = headers.get("webhook-timestamp", "")
    sig_header = headers.get("webhook-signature", "")
    try:
        if abs(time.time() - int(ts)) > TOLERANCE_S:
            return False
    except ValueError:
        return False
    signed = f"{msg_id}.{ts}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    for part in sig_header.split():
        version, _, sig = part.partition(",")
        if version == "v1" and hmac.compare_digest(sig, expected):
            return True
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:9000", help="host:port (default 127.0.0.1:9000)")
    ap.add_argument("--fail-first", type=int, default=0, metavar="N",
                    help="fail the first N attempts of every message (by redrive-attempt)")
    ap.add_argument("--status", type=int, default=503, help="status of a failed attempt (default 503)")
    ap.add_argument("--retry-after", default=None, metavar="SECONDS",
                    help="send Retry-After with failures (with 429/503: rate_limited)")
    args = ap.parse_args()
    secret = os.environ.get("WEBHOOK_SECRET")
    key = secret_bytes(secret) if secret else None

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            attempt = int(headers.get("redrive-attempt", "1"))
            if key is not None and not verify(key, headers, body):
                status, extra = 401, {}
            elif attempt <= args.fail_first:
                status = args.status
                extra = {"Retry-After": args.retry_after} if args.retry_after else {}
            else:
                status, extra = 200, {}
            answer = json.dumps({"status": status}).encode()
            self.send_response(status)
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            try:
                payload = json.dumps(json.loads(body), ensure_ascii=False)
            except ValueError:
                payload = repr(body[:200])
            signed = "" if key is None else (" signature ok" if status != 401 else " BAD SIGNATURE")
            print(f"{time.strftime('%H:%M:%S')} {headers.get('webhook-id', '?')} attempt {attempt} "
                  f"-> {status}{signed}  {payload}", flush=True)

        do_PUT = do_POST
        do_PATCH = do_POST

        def log_message(self, *_):
            pass

    host, _, port = args.listen.rpartition(":")
    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    print(f"push endpoint on http://{args.listen}/ (fail first {args.fail_first} attempt(s) "
          f"with {args.status}{', signatures checked' if key else ''})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
