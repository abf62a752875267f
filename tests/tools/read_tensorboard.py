"""Prints the scalars that TensorBoard itself reads from a directory of event files.

Usage: read_tensorboard.py DIR            the reader (EventAccumulator)
       read_tensorboard.py --server DIR   `tensorboard --logdir DIR`, asked over HTTP

Output: one JSON object, {tag: [[step, wall_time, value], ...]} in TensorBoard's order, plus
"_files" (the event files in DIR). The reader runs with its defaults (purge_orphaned_data on);
the server is the one a user starts (its default loader, the Rust data server when installed),
on a free port of 127.0.0.1, stopped before the script exits.
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request


def from_reader(directory):
    from tensorboard.backend.event_processing import event_accumulator
    reader = event_accumulator.EventAccumulator(
        directory, size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {tag: [[e.step, e.wall_time, e.value] for e in reader.Scalars(tag)]
            for tag in reader.Tags()["scalars"]}


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.load(r)


def from_server(directory, timeout=90):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    server = subprocess.Popen(
        [tensorboard, "--logdir", directory, "--host", "127.0.0.1", "--port", str(port),
         "--reload_interval", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        tags, previous = {}, None
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                tags = get(port, "/data/plugin/scalars/tags")
            except OSError:
                continue
            # Loaded once the tags stop changing between two polls.
            if tags and tags == previous:
                break
            previous = tags
        out = {}
        for run, run_tags in tags.items():
            for tag in run_tags:
                query = urllib.parse.urlencode({"run": run, "tag": tag})
                out[tag] = [[p[1], p[0], p[2]]
                            for p in get(port, "/data/plugin/scalars/scalars?" + query)]
        return out
    finally:
        server.kill()
        server.wait()


def main():
    args = sys.argv[1:]
    server = args[:1] == ["--server"]
    if server:
        args = args[1:]
    if len(args) != 1 or not os.path.isdir(args[0]):
        print(__doc__, file=sys.stderr)
        return 2
    out = from_server(args[0]) if server else from_reader(args[0])
    out["_files"] = sorted(f for f in os.listdir(args[0]) if "tfevents" in f)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
