"""A TLS server on 127.0.0.1 that stands in for an API server (or an impostor of one), and the
openssl-made certificates it and its clients use.

It records what each connection brought: whether the TLS handshake succeeded, and the request
line and headers of every request (so a test can tell whether a token was ever sent to it). It
answers every request with one fixed status and body, and `Connection: close`, so that each
request is a new connection and a switch of its certificate (`rotate`) is seen at once.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@dataclass
class Pki:
    """Certificates made with openssl in `directory`: CAs, and leaves signed by one of them."""

    directory: Path

    def ca(self, name: str) -> tuple[Path, Path]:
        cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-days", "1", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return cert, key

    def leaf(self, name: str, ca: tuple[Path, Path], cn: str, san: str | None = "IP:127.0.0.1",
             client: bool = False) -> tuple[Path, Path]:
        """A certificate for `cn` signed by `ca`; `san` None: no subjectAltName at all (the name in the CN only)."""
        cert, key, csr = (self.directory / f"{name}.crt", self.directory / f"{name}.key",
                          self.directory / f"{name}.csr")
        ext = self.directory / f"{name}.ext"
        lines = ["basicConstraints=CA:FALSE", f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}"]
        if san:
            lines.append(f"subjectAltName={san}")
        ext.write_text("\n".join(lines) + "\n")
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-subj", f"/CN={cn}", "-keyout", str(key), "-out", str(csr))
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
                 "-days", "1", "-out", str(cert), "-extfile", str(ext))
        return cert, key


@dataclass
class Seen:
    """What one connection brought."""

    handshake_ok: bool
    error: str = ""
    request_line: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class TlsStandIn:
    """HTTPS on 127.0.0.1: records every connection, answers every request with `status` and `body`."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None, status: int = 200,
                 body: bytes | dict = b"{}") -> None:
        self.status = status
        self.body = json.dumps(body).encode() if isinstance(body, dict) else body
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._context = self._make_context(cert, key, client_ca)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]

    @staticmethod
    def _make_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        if client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(str(client_ca))
        return ctx

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> "TlsStandIn":
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()

    def rotate(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        """Serve another certificate (and trust another client CA) from the next connection on."""
        self._context = self._make_context(cert, key, client_ca)

    def snapshot(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def requests(self) -> list[Seen]:
        return [s for s in self.snapshot() if s.request_line]

    def failed_handshakes(self) -> int:
        return sum(1 for s in self.snapshot() if not s.handshake_ok)

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        try:
            conn = self._context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            self._record(Seen(False, f"{type(exc).__name__}: {exc}"))
            raw.close()
            return
        try:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
            lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            self._record(Seen(True, request_line=lines[0], headers=headers))
            if lines[0]:
                reason = {200: "OK", 401: "Unauthorized", 500: "Internal Server Error"}.get(self.status, "Status")
                conn.sendall(f"HTTP/1.1 {self.status} {reason}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n".encode() + self.body)
        except (OSError, ssl.SSLError) as exc:
            self._record(Seen(True, f"{type(exc).__name__}: {exc}"))
        finally:
            try:
                conn.close()
            except OSError:
                pass


def kubeconfig(path: Path, server: str, cluster: dict, user: dict) -> str:
    """A one-context kubeconfig (JSON is YAML) at `path`; returns its path."""
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "k", "cluster": {"server": server, **cluster}}],
           "users": [{"name": "u", "user": user}],
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    path.write_text(json.dumps(doc))
    return str(path)
