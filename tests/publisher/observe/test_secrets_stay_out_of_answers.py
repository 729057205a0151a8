"""What the publisher prints never carries a token or an upstream answer's text.

The real publisher process, against a local TLS server standing in for the API server
(tests/publisher/tls_standin.py). What is searched is everything an operator or a prober can
read: the process's log, `netclaim-publisher status` (text and JSON) and the /readyz body.
- A token with a line break (token file `abc\\ndef`) cannot be sent as a header; the HTTP layer's
  error quotes the header, token and all. It is refused, naming the file, never the value.
- /readyz is asked by anyone who reaches the metrics port: its reasons name the component and a
  fixed class of failure; the server's own words (a 500's body) go to the log only.
"""

from __future__ import annotations

import secrets
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from publisher_testkit import BIN, Publisher, wait_until
from tls_standin import Pki, TlsStandIn, kubeconfig


@pytest.fixture()
def pki(workdir: Path) -> Pki:
    d = workdir / "pki"
    d.mkdir()
    return Pki(d)


def _readyz(publisher: Publisher) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{publisher.port}/readyz", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _status_outputs(publisher: Publisher) -> list[str]:
    """`netclaim-publisher status` as an operator runs it, text and JSON."""
    outs = []
    for extra in ([], ["-o", "json"]):
        proc = subprocess.run([str(BIN / "netclaim-publisher"), "status", "--socket", publisher.socket, *extra],
                              capture_output=True, text=True, timeout=60)
        outs.append(proc.stdout + proc.stderr)
    return outs


def _everything_printed(publisher: Publisher) -> dict[str, str]:
    texts = {"log": publisher.logs()}
    if publisher.proc is not None and publisher.proc.poll() is None:
        texts["status"], texts["status -o json"] = _status_outputs(publisher)
        texts["/readyz"] = _readyz(publisher)[1]
    return texts


def _token_pieces() -> tuple[str, str]:
    return "tokA" + secrets.token_hex(12), "tokB" + secrets.token_hex(12)


def test_a_token_with_a_line_break_is_refused_naming_the_file_never_the_value(pki: Pki, workdir: Path):
    ca = pki.ca("cluster-ca")
    server = TlsStandIn(*pki.leaf("api", ca, cn="127.0.0.1"), status=401, body={"kind": "Status", "code": 401}).start()
    first, second = _token_pieces()
    token_file = workdir / "token"
    token_file.write_text(f"{first}\n{second}\n")
    kc = kubeconfig(workdir / "kc", server.url, {"certificate-authority": str(ca[0])}, {"tokenFile": str(token_file)})
    publisher = Publisher(kc, workdir).start(wait=False)
    try:
        wait_until("the publisher exits, or its API requests fail",
                   lambda: publisher.proc.poll() is not None or "failed" in publisher.logs())
        for where, text in _everything_printed(publisher).items():
            assert first not in text and second not in text, f"the token is in {where}: {text[-2000:]}"
        assert publisher.proc.wait(30) == 1
        assert f"tokenFile {token_file}: the token has a line break inside" in publisher.logs()
        assert server.requests() == []
    finally:
        publisher.kill()
        server.stop()


def test_a_token_rotated_to_one_with_a_line_break_is_refused_and_the_old_one_kept(pki: Pki, workdir: Path):
    """The reload path: the files are re-read after every 401, and a token that cannot be sent must
    neither replace the working client nor be printed where the reload's failure is reported."""
    ca = pki.ca("cluster-ca")
    server = TlsStandIn(*pki.leaf("api", ca, cn="127.0.0.1"), status=401, body={"kind": "Status", "code": 401}).start()
    token_file = workdir / "token"
    token_file.write_text("good-token\n")
    kc = kubeconfig(workdir / "kc", server.url, {"certificate-authority": str(ca[0])}, {"tokenFile": str(token_file)})
    publisher = Publisher(kc, workdir).start(wait=False)
    try:
        # Positive control: the server sees the token the publisher sends.
        wait_until("the server sees the first token",
                   lambda: "Bearer good-token" in [s.headers.get("authorization") for s in server.requests()])
        first, second = _token_pieces()
        token_file.write_text(f"{first}\n{second}\n")
        wait_until("the reload is refused", lambda: "credentials on disk unusable" in publisher.logs())
        seen = len(server.requests())
        wait_until("requests go on with the old token", lambda: len(server.requests()) > seen + 1)
        assert {s.headers.get("authorization") for s in server.requests()} == {"Bearer good-token"}
        texts = _everything_printed(publisher)
        assert {"status", "status -o json", "/readyz"} <= set(texts), "the publisher is not running"
        for where, text in texts.items():
            assert first not in text and second not in text, f"the token is in {where}: {text[-2000:]}"
        assert f"tokenFile {token_file}: the token has a line break inside" in texts["log"]
    finally:
        publisher.kill()
        server.stop()


def test_readyz_names_the_failing_api_by_class_and_never_quotes_its_answer(pki: Pki, workdir: Path):
    """Takes limits.API_DOWN_NOT_READY (60 s) of failing answers before /readyz says so."""
    ca = pki.ca("cluster-ca")
    marker = "MARKER-" + secrets.token_hex(8)
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
            "message": f"upstream detail {marker} from a proxy"}
    server = TlsStandIn(*pki.leaf("api", ca, cn="127.0.0.1"), status=500, body=body).start()
    kc = kubeconfig(workdir / "kc", server.url, {"certificate-authority": str(ca[0])}, {"token": "t0k"})
    publisher = Publisher(kc, workdir).start(wait=False)
    try:
        code, why = wait_until("/readyz fails on the API",
                               lambda: (lambda r: r if r[0] == 503 and "api:" in r[1] else None)(_readyz(publisher)),
                               timeout=240)
        assert marker not in why, why
        assert "api: failing for" in why and "HTTP 5xx (500)" in why, why
        for where, text in _everything_printed(publisher).items():
            if where != "log":
                assert marker not in text, f"the upstream answer is in {where}: {text[-2000:]}"
        # Positive control: the answer did reach the publisher, and its full text is in the log.
        assert marker in publisher.logs()
    finally:
        publisher.kill()
        server.stop()
