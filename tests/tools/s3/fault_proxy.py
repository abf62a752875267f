#!/usr/bin/env python3
"""An HTTP/1.1 reverse proxy in front of an S3 server that injects the faults S3 clients meet.

The storage tests put it between gpurun and the gateway of scripts/s3-gateway.sh to check that
the object-store client retries what S3 says to retry and gives up on the rest:

  --slowdown-parts N   the first N UploadPart requests (PUT with partNumber= and uploadId= in
                       the query) get 503 SlowDown, S3's "reduce your request rate"; the body is
                       read and dropped first, as S3 does, so the connection stays usable
  --reset-parts N      the next N UploadPart requests (after the SlowDown ones) are cut: about
                       half the body is read, then the client connection is reset (RST, through
                       SO_LINGER 0), as a dropped connection or a crashed load balancer does
  --stall-seconds S    a request whose "METHOD /path?query" matches --stall-match (re.search)
  --stall-match RE     is held S seconds before it is forwarded (at most --stall-count times;
  --stall-count N      0, the default: every time), for the client's timeouts. It is forwarded
                       even when the client has given up meanwhile, as a delayed packet is: a
                       PUT whose body was already sent may still land after the client retried
  --cut-gets N         the first N GETs whose response has a Content-Length over 1 MiB get the
                       response head and half the body, then the connection is closed: a
                       download cut short, which the client sees as a short read

Everything else is forwarded byte for byte, the Host header included: the client's SigV4
signature covers Host and the server recomputes it from the Host it receives. Bodies are
streamed in 64 KiB pieces, with Content-Length or chunked framing; connections are kept alive on
both sides; "Expect: 100-continue" is honoured (botocore sends it with every file-like body,
libcurl with bodies over 1 MiB).

--control FILE is a JSON object with the flags' keys ("slowdown_parts", "reset_parts",
"stall_seconds", "stall_match", "stall_count", "cut_gets"), read again before each request: each
time the file is written (a new inode, mtime or content), each key in it sets that fault's
remaining count (or setting) anew. A test arms a fault mid-run by writing the file (a temporary
file renamed over it, so that no request reads half of it).

Each injected fault is one JSON line in --log FILE:
  {"fault": "slowdown"|"reset"|"stall"|"cut_get", "method": ..., "path": ..., "query": ...}

The listening port (--port, 0 for any free one) goes to --port-file once it listens.
Python 3 standard library only; one thread per client connection.
"""
import argparse
import json
import os
import re
import select
import socket
import struct
import sys
import threading
import time
import urllib.parse

CHUNK = 64 * 1024
BIG_GET = 1024 * 1024  # --cut-gets applies to responses larger than this
CONTINUE_WAIT = 1.0  # seconds a server may take to answer "Expect: 100-continue"
SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>'
                 b"<Error><Code>SlowDown</Code>"
                 b"<Message>Please reduce your request rate.</Message>"
                 b"<RequestId>fault-proxy</RequestId></Error>")


class Faults:
    """The remaining fault budgets, shared by all connections, and the fault log."""

    KEYS = ("slowdown_parts", "reset_parts", "stall_seconds", "stall_match", "stall_count",
            "cut_gets")

    def __init__(self, args):
        self.lock = threading.Lock()
        self.slowdown_parts = args.slowdown_parts
        self.reset_parts = args.reset_parts
        self.stall_seconds = args.stall_seconds
        self.stall_match = args.stall_match
        self.stall_count = args.stall_count
        self.stalls = 0
        self.cut_gets = args.cut_gets
        self.control = args.control
        self.control_seen = None
        self.log = open(args.log, "a", buffering=1) if args.log else None

    def reload(self):
        """Applies --control FILE when its content differs from what was last applied."""
        if not self.control:
            return
        try:
            with open(self.control, "rb") as f:
                st = os.fstat(f.fileno())
                raw = f.read()
        except FileNotFoundError:
            return
        # A file written again with the same content arms the same faults again.
        seen = (st.st_ino, st.st_mtime_ns, raw)
        with self.lock:
            if seen == self.control_seen:
                return
            try:
                settings = json.loads(raw or b"{}")
            except ValueError:
                return  # half written: the next request reads it again
            self.control_seen = seen
            for key, value in settings.items():
                key = key.replace("-", "_")
                if key not in self.KEYS:
                    print(f"fault_proxy: unknown control key {key!r}", file=sys.stderr)
                    continue
                setattr(self, key, value)
                if key in ("stall_match", "stall_count", "stall_seconds"):
                    self.stalls = 0

    def take(self, name):
        """Spends one unit of budget `name`; whether there was one."""
        with self.lock:
            left = getattr(self, name)
            if left > 0:
                setattr(self, name, left - 1)
                return True
            return False

    def should_stall(self, target):
        with self.lock:
            if not self.stall_match or self.stall_seconds <= 0:
                return 0
            if self.stall_count and self.stalls >= self.stall_count:
                return 0
            if not re.search(self.stall_match, target):
                return 0
            self.stalls += 1
            return self.stall_seconds

    def record(self, fault, req):
        line = json.dumps({"fault": fault, "method": req.method, "path": req.path,
                           "query": req.query})
        with self.lock:
            if self.log:
                self.log.write(line + "\n")


class Request:
    def __init__(self, head, method, target, version, headers):
        self.head = head  # the raw bytes of the request line and headers, forwarded as they are
        self.method = method
        split = urllib.parse.urlsplit(target)
        self.path = split.path
        self.query = split.query
        self.target = method + " " + target
        self.version = version
        self.headers = headers  # lower-case name -> value (the last one)

    def is_upload_part(self):
        q = urllib.parse.parse_qs(self.query, keep_blank_values=True)
        return self.method == "PUT" and "partNumber" in q and "uploadId" in q

    def expects_continue(self):
        return self.headers.get("expect", "").lower() == "100-continue"

    def wants_close(self):
        conn = self.headers.get("connection", "").lower()
        return conn == "close" or (self.version == "HTTP/1.0" and conn != "keep-alive")


def read_head(f):
    """Reads a request or response head: (raw bytes, first line, headers), or None at EOF."""
    raw = bytearray()
    line = f.readline(65536)
    while line in (b"\r\n", b"\n"):  # stray empty lines between messages are allowed
        line = f.readline(65536)
    if not line:
        return None
    raw += line
    first = line.decode("latin-1").rstrip("\r\n")
    headers = {}
    while True:
        line = f.readline(65536)
        if not line:
            raise ConnectionError("connection closed inside a message head")
        raw += line
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return bytes(raw), first, headers


def body_framing(headers):
    """('chunked', None), ('length', n) or ('none', None) for a request."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return "chunked", None
    if "content-length" in headers:
        return "length", int(headers["content-length"])
    return "none", None


def copy_exact(src, n, dst=None):
    """Reads n bytes from file src, sending them to socket dst (or dropping them)."""
    while n > 0:
        data = src.read(min(CHUNK, n))
        if not data:
            raise ConnectionError("connection closed inside a body")
        if dst is not None:
            dst.sendall(data)
        n -= len(data)


def copy_chunked(src, dst=None):
    """Relays a chunked body as it is (sizes, extensions, trailers) until its end."""
    while True:
        line = src.readline(65536)
        if not line:
            raise ConnectionError("connection closed inside a chunked body")
        if dst is not None:
            dst.sendall(line)
        size = int(line.split(b";")[0].strip(), 16)
        if size == 0:
            while True:  # trailers, then the empty line
                line = src.readline(65536)
                if not line:
                    raise ConnectionError("connection closed inside chunked trailers")
                if dst is not None:
                    dst.sendall(line)
                if line in (b"\r\n", b"\n"):
                    return
        copy_exact(src, size + 2, dst)  # the data and its CRLF


def copy_body(src, framing, dst=None):
    kind, n = framing
    if kind == "chunked":
        copy_chunked(src, dst)
    elif kind == "length":
        copy_exact(src, n, dst)


def reset(sock):
    """Closes with a TCP RST instead of a FIN: SO_LINGER on, timeout 0."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


class Connection:
    """One client connection and the upstream connection it uses."""

    def __init__(self, client, upstream, faults):
        self.client = client
        self.cin = client.makefile("rb", buffering=CHUNK)
        self.upstream_addr = upstream
        self.faults = faults
        self.up = None
        self.uin = None

    def close_upstream(self):
        if self.up is not None:
            try:
                self.uin.close()
                self.up.close()
            except OSError:
                pass
        self.up = self.uin = None

    def upstream(self):
        # Between two requests a kept-alive server connection has nothing to say: readable means
        # the server closed it (RGW after its idle timeout), so a new one is opened.
        if self.up is not None and select.select([self.up], [], [], 0)[0]:
            self.close_upstream()
        if self.up is None:
            self.up = socket.create_connection(self.upstream_addr)
            self.up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.uin = self.up.makefile("rb", buffering=CHUNK)
        return self.up

    def run(self):
        try:
            while self.serve_one():
                pass
        except (OSError, ValueError, ConnectionError):
            pass  # either side went away: this connection ends, the proxy goes on
        finally:
            self.close_upstream()
            try:
                self.cin.close()
                self.client.close()
            except OSError:
                pass

    def serve_one(self):
        """Serves one request; whether the client connection stays open for the next."""
        got = read_head(self.cin)
        if got is None:
            return False
        raw, first, headers = got
        method, target, version = first.split(" ", 2)
        req = Request(raw, method, target, version, headers)
        framing = body_framing(headers)
        self.faults.reload()

        if req.is_upload_part():
            if self.faults.take("slowdown_parts"):
                self.faults.record("slowdown", req)
                if req.expects_continue():
                    self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                copy_body(self.cin, framing)  # read and dropped, as S3 does before its error
                self.client.sendall(
                    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                    b"Content-Length: %d\r\nx-amz-request-id: fault-proxy\r\n\r\n%s"
                    % (len(SLOWDOWN_BODY), SLOWDOWN_BODY))
                return not req.wants_close()
            if self.faults.take("reset_parts"):
                self.faults.record("reset", req)
                if req.expects_continue():
                    self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                kind, n = framing
                if kind == "length":
                    copy_exact(self.cin, n // 2)
                elif kind == "chunked":
                    self.cin.read1(CHUNK)
                self.cin.close()  # the socket's descriptor closes with its last file object
                reset(self.client)
                return False

        delay = self.faults.should_stall(req.target)
        if delay:
            self.faults.record("stall", req)
            time.sleep(delay)

        try:
            up = self.upstream()
            up.sendall(req.head)
        except OSError:
            # A kept-alive upstream connection the server has closed meanwhile: one new try.
            self.close_upstream()
            up = self.upstream()
            up.sendall(req.head)

        if (req.expects_continue() and framing != ("length", 0)
                and select.select([up], [], [], CONTINUE_WAIT)[0]):
            # The client sends the body only after "100 Continue": the server's, relayed. (A
            # server that says nothing within CONTINUE_WAIT gets the body, as curl and botocore
            # send it then; its late 100 is relayed below with the other interim responses.)
            status, resp = self.read_response_head()
            if status == 100:
                self.client.sendall(resp[0])
                copy_body(self.cin, framing, up)
            else:
                # A final answer before the body (an auth error): the client may or may not send
                # the body now, so this connection cannot be reused.
                self.relay_response(req, status, resp)
                self.close_upstream()
                return False
        else:
            copy_body(self.cin, framing, up)

        while True:
            status, resp = self.read_response_head()
            if status >= 200 or status == 101:
                break
            self.client.sendall(resp[0])  # another interim response: relayed as it is
        keep = self.relay_response(req, status, resp)
        return keep and not req.wants_close()

    def read_response_head(self):
        got = read_head(self.uin)
        if got is None:
            raise ConnectionError("the server closed the connection")
        raw, first, headers = got
        return int(first.split(" ", 2)[1]), (raw, first, headers)

    def relay_response(self, req, status, resp):
        """Sends one response (head and body) to the client; whether both sides stay open."""
        raw, first, headers = resp
        if req.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            framing = ("length", 0)
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            framing = ("chunked", None)
        elif "content-length" in headers:
            framing = ("length", int(headers["content-length"]))
        else:
            framing = ("close", None)  # the body runs until the server closes

        if (req.method == "GET" and framing[0] == "length" and framing[1] > BIG_GET
                and self.faults.take("cut_gets")):
            self.faults.record("cut_get", req)
            self.client.sendall(raw)
            copy_exact(self.uin, framing[1] // 2, self.client)
            self.close_upstream()  # the rest of the body is still on its way: unusable
            self.client.shutdown(socket.SHUT_RDWR)
            return False

        self.client.sendall(raw)
        if framing[0] == "close":
            while True:
                data = self.uin.read1(CHUNK)
                if not data:
                    break
                self.client.sendall(data)
            self.close_upstream()
            return False
        copy_body(self.uin, framing, self.client)
        if headers.get("connection", "").lower() == "close":
            self.close_upstream()
            return False
        return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT of the S3 server")
    p.add_argument("--port", type=int, default=0, help="port to listen on, 0 for any free one")
    p.add_argument("--port-file", help="write the listening port here once listening")
    p.add_argument("--log", help="append one JSON line per injected fault here")
    p.add_argument("--control", help="JSON file of fault settings, read before each request")
    p.add_argument("--slowdown-parts", type=int, default=0)
    p.add_argument("--reset-parts", type=int, default=0)
    p.add_argument("--stall-seconds", type=float, default=0)
    p.add_argument("--stall-match", default="")
    p.add_argument("--stall-count", type=int, default=0)
    p.add_argument("--cut-gets", type=int, default=0)
    args = p.parse_args()

    up = urllib.parse.urlsplit(args.upstream)
    if up.scheme != "http" or not up.hostname:
        p.error(f"--upstream must be http://HOST:PORT, got {args.upstream}")
    upstream = (up.hostname, up.port or 80)
    faults = Faults(args)

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", args.port))
    server.listen(128)
    port = server.getsockname()[1]
    if args.port_file:
        # Written whole and renamed, so that a test polling for the file never reads half of it.
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    print(f"fault_proxy: 127.0.0.1:{port} -> {upstream[0]}:{upstream[1]}", file=sys.stderr,
          flush=True)
    while True:
        client, _ = server.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=Connection(client, upstream, faults).run, daemon=True).start()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
