"""Acting as another local user, for the tests of the socket's peer checks.

The child is forked, drops to the uid (groups too), runs one function and
sends its JSON-serializable answer back through a pipe; it leaves with
os._exit so that none of pytest's clean-up runs twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any, Callable


def run_as_uid(uid: int, func: Callable[[], Any]) -> Any:
    """func() in a child running as `uid` (and gid `uid`); an exception it lets
    escape comes back as {"child_error": "Type: message"}."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            answer = func()
        except Exception as exc:  # report, never raise in the forked pytest
            answer = {"child_error": f"{type(exc).__name__}: {exc}"}
        os.write(write_fd, json.dumps(answer).encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return json.loads(data)


# Runs as another uid: answers every GET with 200 `chained conflist=x` on each 127.0.0.1 port (or unix socket
# path) given, the way a chain keeper that is chained would; prints "listening" once all are bound.
SQUATTER = r"""
import socketserver, sys, threading
from http.server import BaseHTTPRequestHandler, HTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"chained conflist=x\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
servers = [UnixServer(where, Handler) if where.startswith("/") else HTTPServer(("127.0.0.1", int(where)), Handler)
           for where in sys.argv[1:]]
for server in servers:
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("listening", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def squatting(*where: int | str, uid: int = 65534) -> Iterator[subprocess.Popen[str]]:
    """A real process of `uid` (no groups) listening on 127.0.0.1:PORT, or a unix socket PATH, for each
    one given and answering `200 chained conflist=x`, until the block ends."""
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-I", "-c",
           SQUATTER, *map(str, where)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening", "the squatter did not bind"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)
