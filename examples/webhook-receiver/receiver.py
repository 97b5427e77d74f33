#!/usr/bin/env python3
"""A webhook receiver for `fabric serve`'s completion webhooks, verified with the Standard
Webhooks reference library (`pip install standardwebhooks`).

    FABRIC_WEBHOOK_SECRET=whsec_... python3 examples/webhook-receiver/receiver.py [PORT]

It prints its URL on the first line, then one JSON line per verified delivery:
`{"webhook_id", "type", "run_id", "status", "duplicate"}`. A delivery whose signature or
timestamp does not verify is answered 400 (the runtime tries it again, then gives up); a
repeated `webhook-id` (delivery is at least once) is answered 204 again and marked a duplicate.
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

MAX_BODY = 1024 * 1024


def main() -> None:
    secret = os.environ.get("FABRIC_WEBHOOK_SECRET")
    if not secret:
        sys.exit("receiver.py: set FABRIC_WEBHOOK_SECRET to the fleet's secret (whsec_...)")
    verifier = Webhook(secret)
    seen: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length > MAX_BODY:
                self.send_response(413)
                self.end_headers()
                return
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                event = verifier.verify(body, headers)
            except WebhookVerificationError as e:
                print(f"receiver.py: refused a delivery: {e}", file=sys.stderr, flush=True)
                self.send_response(400)
                self.end_headers()
                return
            webhook_id = headers["webhook-id"]
            line = {
                "webhook_id": webhook_id,
                "type": event["type"],
                "run_id": event["data"]["run_id"],
                "status": event["data"]["status"],
                "duplicate": webhook_id in seen,
            }
            seen.add(webhook_id)
            print(json.dumps(line), flush=True)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:  # one line per delivery is printed above
            pass

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
