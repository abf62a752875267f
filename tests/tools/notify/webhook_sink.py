#!/usr/bin/env python3
"""A loopback webhook for the notification tests: it takes what gpurun POSTs, as Slack's,
Discord's or ntfy's incoming webhooks would, and records it.

Every POST is one JSON line in --log: time, path, status answered, and body (the parsed JSON,
or the raw text when it does not parse). --fail-first N answers the first N POSTs with HTTP 500
(a webhook service's bad moment) and every later one with 200; --status CODE answers every POST
with CODE instead. --secret-path PATH answers 404 to any other path (a webhook's URL is its
password). The listening port goes to --port-file once it listens. Python 3 standard library
only.
"""
import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--status", type=int, default=0)
    parser.add_argument("--secret-path", default="")
    args = parser.parse_args()
    lock = threading.Lock()
    posts = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length).decode("utf-8", "replace")
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw
            with lock:
                posts[0] += 1
                if args.secret_path and self.path != args.secret_path:
                    status = 404
                elif args.status:
                    status = args.status
                else:
                    status = 500 if posts[0] <= args.fail_first else 200
                with open(args.log, "a") as log:
                    log.write(json.dumps({"time": time.time(), "path": self.path,
                                          "status": status,
                                          "content_type": self.headers.get("Content-Type"),
                                          "body": body}) + "\n")
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *unused):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
