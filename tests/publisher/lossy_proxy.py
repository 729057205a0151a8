"""An HTTPS proxy in front of the real API server that can lose the answer of a status apply.

It terminates TLS with its own certificate (made with openssl), relays each request
on its own upstream TLS connection to the real kube-apiserver (`Connection: close`,
so every client connection carries one request and a response is relayed until
the server closes it; watches stream through). While `lose` is set, a PATCH of a
`/status` subresource is forwarded, the API server's full answer is read and thrown
away, and the client's connection is reset: the server applied the change, the
client saw a connection reset. That is an apply lost in flight, for real.

While `hold` is set, the next status PATCH is not forwarded yet: the client's
connection is reset at once and the request is kept until `release()` sends it
to the API server: an apply whose answer was lost and that lands late, after
the client has already retried (a request stuck in a slow server or an
intermediary).

While `throttle` is above 0, a status PATCH is not forwarded: it is answered 429
with `Retry-After: <throttle>` (seconds), as the API server's priority and fairness
answers a client it throttles; `throttled` counts those answers.

With `apply_delay` (seconds, default 0) every status PATCH waits that long
before it is forwarded: an API server whose applies are slow
(scripts/harness/benchlib/publisher_burst.py measures a burst of ADDs so).
`upstream_timeout` (default 30 s) bounds each upstream read, so it also ends a
watch that stays silent that long; the bench raises it, so that its count of
requests does not include the relists after such a cut.
"""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

HEAD_LIMIT = 64 << 10


class LossyApiProxy:
    def __init__(self, upstream: str, upstream_ca: str, workdir: Path, apply_delay: float = 0.0,
                 upstream_timeout: float = 30.0) -> None:
        url = urlparse(upstream)
        self.upstream = (url.hostname or "127.0.0.1", url.port or 443)
        self.cert = str(workdir / "proxy-cert.pem")
        key = str(workdir / "proxy-key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", self.cert,
                        "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(self.cert, key)
        self.client_ctx = ssl.create_default_context(cafile=upstream_ca)
        self.lose = threading.Event()
        self.hold = threading.Event()
        self.apply_delay = apply_delay
        self.throttle = 0
        self.throttled = 0
        self.upstream_timeout = upstream_timeout
        self.held: list[bytes] = []
        self.lost = 0
        self.patches = 0
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()  # upstream connections being relayed (watches stay open)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> "LossyApiProxy":
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            live = list(self._live)
        for up in live:  # a watch relayed for a publisher already gone must not outlive the test
            try:
                up.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _before_forward(self, head: bytes) -> None:
        """Called with each request's head before anything else is done with it: a subclass's delay."""

    def _serve(self, raw: socket.socket) -> None:
        try:
            conn = self.server_ctx.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        try:
            head, body = _read_request(conn)
            if head is None:
                return
            self._before_forward(head)
            method, path = head.split(b" ", 2)[:2]
            status_patch = method == b"PATCH" and b"/status" in path.split(b"?")[0]
            if status_patch and self._take_hold():
                self.held.append(_closing(head) + body)
                _reset(conn)
                return
            if status_patch and self._throttled(conn):
                return
            lose = status_patch and self._count_patch()
            if status_patch and self.apply_delay > 0:
                time.sleep(self.apply_delay)  # a slow apply: the client waits this much longer for its answer
            with socket.create_connection(self.upstream, timeout=self.upstream_timeout) as up_raw:
                with self._lock:
                    self._live.add(up_raw)
                try:
                    with self.client_ctx.wrap_socket(up_raw, server_hostname=self.upstream[0]) as up:
                        up.sendall(_closing(head) + body)
                        self._relay(up, None if lose else conn)
                finally:
                    with self._lock:
                        self._live.discard(up_raw)
            if lose:
                with self._lock:
                    self.lost += 1
                _reset(conn)
        except (OSError, ssl.SSLError, ValueError):
            pass
        finally:
            conn.close()

    def _take_hold(self) -> bool:
        with self._lock:
            if not self.hold.is_set():
                return False
            self.hold.clear()
            return True

    def release(self) -> list[int]:
        """Send the held requests to the API server now; their HTTP status codes."""
        codes = []
        while self.held:
            request = self.held.pop(0)
            with socket.create_connection(self.upstream, timeout=30) as up_raw:
                with self.client_ctx.wrap_socket(up_raw, server_hostname=self.upstream[0]) as up:
                    up.sendall(request)
                    answer = b""
                    while b"\r\n" not in answer:
                        data = up.recv(65536)
                        if not data:
                            break
                        answer += data
                    codes.append(int(answer.split(b" ", 2)[1]) if answer else 0)
                    self._relay(up, None)
        return codes

    def _throttled(self, conn: ssl.SSLSocket) -> bool:
        """Answer 429 with Retry-After while `throttle` is set (the request is not forwarded)."""
        with self._lock:
            seconds = self.throttle
            if seconds <= 0:
                return False
            self.throttled += 1
        body = (b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Too many requests,'
                b' please try again later.","reason":"TooManyRequests","code":429}')
        conn.sendall(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                     b"Retry-After: %d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (seconds, len(body))
                     + body)
        return True

    def _count_patch(self) -> bool:
        with self._lock:
            self.patches += 1
        return self.lose.is_set()

    @staticmethod
    def _relay(up: ssl.SSLSocket, client: ssl.SSLSocket | None) -> None:
        """The answer until the server closes; thrown away when there is no client to give it to."""
        while True:
            data = up.recv(65536)
            if not data:
                return
            if client is not None:
                client.sendall(data)


def _read_request(conn: ssl.SSLSocket) -> tuple[bytes | None, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None, b""
        buf += data
        if len(buf) > HEAD_LIMIT:
            raise ValueError("request head too large")
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        if name.strip().lower() == b"transfer-encoding":
            raise ValueError("chunked request bodies are not relayed")
    while len(body) < length:
        data = conn.recv(65536)
        if not data:
            raise ValueError("request body cut short")
        body += data
    return head, body


def _closing(head: bytes) -> bytes:
    """The request head with `Connection: close`: one request per upstream connection."""
    lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
    return b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n"


def _reset(conn: ssl.SSLSocket) -> None:
    """Close with a TCP reset (SO_LINGER 0): what a client sees when a connection is cut."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
