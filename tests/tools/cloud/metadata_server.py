#!/usr/bin/env python3
"""A loopback metadata service that speaks AWS's IMDSv2, GCP's metadata server and Azure's IMDS.

The preemption-notice tests point gpurun at it (AWS_EC2_METADATA_SERVICE_ENDPOINT,
GCE_METADATA_HOST, GPURUN_AZURE_METADATA_ENDPOINT) and raise a notice at a moment of their
choosing: the notice is up while --notice-file exists (the test creates it once gpurun logged a
step, and removes it for the resume, "another machine"). Like the real services, it insists on
its token and headers:

AWS IMDSv2
  PUT /latest/api/token            needs X-aws-ec2-metadata-token-ttl-seconds in 1..21600 (400
                                   otherwise); answers a fresh token, valid for that TTL or
                                   --aws-token-seconds, whichever is shorter
  GET /latest/meta-data/...        needs X-aws-ec2-metadata-token, a live token (401 otherwise)
      spot/instance-action         404 without a notice; with one {"action": "terminate",
                                   "time": the first answer's time + 120 s}
      events/maintenance/scheduled a system-reboot 7 days ahead (not to be acted on yet) and a
                                   completed instance-stop
GCP
  GET /computeMetadata/v1/instance/...  needs Metadata-Flavor: Google (403 otherwise); every
                                   answer carries Metadata-Flavor: Google and an ETag
      preempted                    FALSE, TRUE with a notice; wait_for_change=true waits up to
                                   timeout_sec for a change, at once when last_etag is not the
                                   current value's ETag
      maintenance-event            MIGRATE_ON_HOST_MAINTENANCE (a live migration: not a stop)
Azure
  /metadata/...                    needs Metadata: true and an api-version (400 otherwise)
  GET  instance/compute/name       gpurun-test-vm
  GET  scheduledevents             a Reboot of another machine and a Freeze of this one; with a
                                   notice also a Preempt of this one (EventId PREEMPT_ID),
                                   NotBefore 30 s after its first answer; DocumentIncarnation
                                   grows with every change
  POST scheduledevents             {"StartRequests": [{"EventId": ...}]}: 200; the events named
                                   are started (gone from the list)

--refuse answers every request as if its token or header were missing (AWS: every token is
issued, none accepted; GCP 403; Azure 400). --faults LIST cycles through LIST per request
(ok | 500 | garbage | hang): 500 is an HTTP 500, garbage a 200 whose body no protocol reads,
hang holds the request --hang-seconds before answering.

Every request is one JSON line in --log: time, method, path, query, status, and fault, notice
or body (a POST's) where there is one. The listening port goes to --port-file once it listens.
Python 3 standard library only; one thread per connection.
"""
import argparse
import email.utils
import json
import os
import secrets
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREEMPT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
VM_NAME = "gpurun-test-vm"
ETAGS = {"FALSE": "5e1bd0ff3b2c8a47", "TRUE": "9a0c3e77d15f6b28"}


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def aws_time(t):
    return time.strftime("%d %b %Y %H:%M:%S GMT", time.gmtime(t))


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.tokens = {}  # token -> expiry (monotonic)
        self.requests = 0
        self.raised = {}  # cloud -> the unix time of its first answer with the notice
        self.started = set()  # Azure events started by an acknowledgement
        self.incarnation = 1
        self.faults = [f for f in args.faults.split(",") if f] if args.faults else []
        self.log = open(args.log, "a", buffering=1) if args.log else None

    def notice(self, cloud):
        """Whether the notice is up; the time it was first answered for `cloud`."""
        if not (self.args.notice_file and os.path.exists(self.args.notice_file)):
            return None
        with self.lock:
            if cloud not in self.raised:
                self.raised[cloud] = time.time()
                self.incarnation += 1
            return self.raised[cloud]

    def next_fault(self):
        with self.lock:
            self.requests += 1
            if not self.faults:
                return "ok"
            return self.faults[(self.requests - 1) % len(self.faults)]

    def record(self, entry):
        entry["time"] = time.time()
        with self.lock:
            if self.log:
                self.log.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    server_version = "metadata-test"

    def log_message(self, fmt, *args):  # the JSON log is the record
        pass

    def answer(self, status, body=b"", headers=None, entry=None):
        if isinstance(body, str):
            body = body.encode()
        entry = dict(entry or {})
        entry.update(method=self.command, path=self.url.path, query=self.url.query, status=status)
        self.state.record(entry)
        try:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout)

    def handle_any(self):
        self.url = urllib.parse.urlsplit(self.path)
        self.query = urllib.parse.parse_qs(self.url.query)
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        fault = self.state.next_fault()
        if fault == "500":
            return self.answer(500, "Internal Server Error", entry={"fault": fault})
        if fault == "garbage":
            return self.answer(200, b"\x00\xff<html>{not json", entry={"fault": fault},
                               headers={"Metadata-Flavor": "Google"})
        if fault == "hang":
            self.state.record({"fault": "hang", "method": self.command, "path": self.url.path})
            time.sleep(self.state.args.hang_seconds)
        path = self.url.path
        if path.startswith("/latest/"):
            return self.aws()
        if path.startswith("/computeMetadata/v1/"):
            return self.gcp()
        if path.startswith("/metadata/"):
            return self.azure()
        return self.answer(404, "Not Found")

    do_GET = do_PUT = do_POST = handle_any

    # AWS IMDSv2 --------------------------------------------------------------------------
    def aws(self):
        state, path = self.state, self.url.path
        if path == "/latest/api/token" and self.command == "PUT":
            try:
                ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
            except ValueError:
                ttl = 0
            if not 1 <= ttl <= 21600:
                return self.answer(400, "Bad Request")
            token = secrets.token_urlsafe(24)
            with state.lock:
                state.tokens[token] = time.monotonic() + min(ttl, state.args.aws_token_seconds)
            return self.answer(200, token, {"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)})
        token = self.headers.get("X-aws-ec2-metadata-token", "")
        with state.lock:
            live = state.tokens.get(token, 0) > time.monotonic()
        if state.args.refuse or not live:
            return self.answer(401, "Unauthorized")
        if path == "/latest/meta-data/spot/instance-action":
            raised = state.notice("aws")
            if raised is None:
                return self.answer(404, "Not Found")
            body = json.dumps({"action": "terminate", "time": iso(raised + 120)})
            return self.answer(200, body, {"Content-Type": "text/plain"}, {"notice": "aws"})
        if path == "/latest/meta-data/events/maintenance/scheduled":
            now = time.time()
            events = [
                {"Code": "system-reboot", "Description": "scheduled reboot",
                 "EventId": "instance-event-0d59937288b749b32", "NotBefore": aws_time(now + 7 * 86400),
                 "NotAfter": aws_time(now + 7 * 86400 + 7200), "State": "active"},
                {"Code": "instance-stop", "Description": "[Completed] instance stop",
                 "EventId": "instance-event-0e439355b5a8e0cd1", "NotBefore": aws_time(now - 3600),
                 "NotAfter": aws_time(now - 1800), "State": "completed"},
            ]
            return self.answer(200, json.dumps(events), {"Content-Type": "text/plain"})
        return self.answer(404, "Not Found")

    # GCP ---------------------------------------------------------------------------------
    def gcp(self):
        state, path = self.state, self.url.path
        if state.args.refuse or self.headers.get("Metadata-Flavor") != "Google":
            return self.answer(403, "Missing Metadata-Flavor:Google header.")
        google = {"Metadata-Flavor": "Google", "Content-Type": "application/text"}
        if path == "/computeMetadata/v1/instance/preempted":
            def value():
                return "TRUE" if state.notice("gcp") is not None else "FALSE"
            if self.query.get("wait_for_change", [""])[0] == "true":
                timeout = float(self.query.get("timeout_sec", ["300"])[0])
                last = self.query.get("last_etag", [""])[0]
                start = value()
                deadline = time.monotonic() + min(timeout, 600)
                if last in ("", ETAGS[start]):
                    while value() == start and time.monotonic() < deadline:
                        time.sleep(0.05)
            word = value()
            entry = {"notice": "gcp"} if word == "TRUE" else {}
            return self.answer(200, word, dict(google, ETag=ETAGS[word]), entry)
        if path == "/computeMetadata/v1/instance/maintenance-event":
            return self.answer(200, "MIGRATE_ON_HOST_MAINTENANCE",
                               dict(google, ETag="77aa01b2c3d4e5f6"))
        return self.answer(404, "Not Found", google)

    # Azure -------------------------------------------------------------------------------
    def azure(self):
        state, path = self.state, self.url.path
        if (state.args.refuse or self.headers.get("Metadata") != "true"
                or "api-version" not in self.query):
            return self.answer(400, json.dumps({"error": "Bad request. Required metadata header "
                                                         "not specified"}))
        if path == "/metadata/instance/compute/name":
            return self.answer(200, VM_NAME, {"Content-Type": "text/plain"})
        if path != "/metadata/scheduledevents":
            return self.answer(404, "Not Found")
        if self.command == "POST":
            try:
                ids = [r["EventId"] for r in json.loads(self.body)["StartRequests"]]
            except (ValueError, KeyError, TypeError):
                return self.answer(400, "Bad Request", entry={"body": self.body.decode("latin-1")})
            with state.lock:
                state.started.update(ids)
                state.incarnation += 1
            return self.answer(200, "", entry={"body": self.body.decode("latin-1"),
                                               "acknowledged": ids})
        events = [
            {"EventId": "0E0A6B9B-61E7-4E0B-9C2C-A3B0A8C39D11", "EventStatus": "Scheduled",
             "EventType": "Reboot", "ResourceType": "VirtualMachine", "Resources": ["other-vm"],
             "NotBefore": email.utils.formatdate(time.time() + 600, usegmt=True),
             "Description": "", "EventSource": "Platform", "DurationInSeconds": -1},
            {"EventId": "5A1F3C2B-7D84-4E4A-8B0E-0F6E2D9C1B77", "EventStatus": "Scheduled",
             "EventType": "Freeze", "ResourceType": "VirtualMachine", "Resources": [VM_NAME],
             "NotBefore": email.utils.formatdate(time.time() + 300, usegmt=True),
             "Description": "", "EventSource": "Platform", "DurationInSeconds": 9},
        ]
        raised = state.notice("azure")
        entry = {}
        if raised is not None and PREEMPT_ID not in state.started:
            events.append({"EventId": PREEMPT_ID, "EventStatus": "Scheduled",
                           "EventType": "Preempt", "ResourceType": "VirtualMachine",
                           "Resources": [VM_NAME],
                           "NotBefore": email.utils.formatdate(raised + 30, usegmt=True),
                           "Description": "", "EventSource": "Platform",
                           "DurationInSeconds": -1})
            entry = {"notice": "azure"}
        with state.lock:
            incarnation = state.incarnation
        body = json.dumps({"DocumentIncarnation": incarnation, "Events": events})
        return self.answer(200, body, {"Content-Type": "application/json"}, entry)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0, help="port to listen on, 0 for any free one")
    p.add_argument("--port-file", help="write the listening port here once listening")
    p.add_argument("--log", help="append one JSON line per request here")
    p.add_argument("--notice-file", help="the notice is up while this file exists")
    p.add_argument("--refuse", action="store_true", help="refuse every token and header")
    p.add_argument("--faults", default="", help="ok,500,garbage,hang cycled per request")
    p.add_argument("--hang-seconds", type=float, default=30)
    p.add_argument("--aws-token-seconds", type=float, default=21600,
                   help="the longest life of an IMDSv2 token")
    args = p.parse_args()
    Handler.state = State(args)
    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    port = server.server_address[1]
    if args.port_file:
        # Written whole and renamed, so that a test polling for the file never reads half of it.
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    print(f"metadata_server: 127.0.0.1:{port}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
