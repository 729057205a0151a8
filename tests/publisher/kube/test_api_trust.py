"""Whom the API client trusts and what it sends: exactly the kubeconfig's CA, names from SANs only,
a contradictory TLS setting refused, and the token from the file that is kept fresh.

The servers are local TLS servers (tests/publisher/tls_standin.py) with openssl-made certificates;
the "system store" is a CA bundle given to the process in SSL_CERT_FILE, which OpenSSL's default
verify paths read: an impostor whose certificate that store trusts must never see the token.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import urllib3

from publisher.kube import apiclient
from publisher_testkit import Publisher, wait_until
from tls_standin import Pki, TlsStandIn, kubeconfig


@pytest.fixture()
def pki(workdir: Path) -> Pki:
    d = workdir / "pki"
    d.mkdir()
    return Pki(d)


@pytest.fixture()
def impostor(pki: Pki, monkeypatch):
    """A server whose certificate only the "system store" (SSL_CERT_FILE, for every process started
    from here on) trusts: (server, the store's CA file)."""
    system_ca = pki.ca("system-ca")
    cert = pki.leaf("impostor", system_ca, cn="127.0.0.1")
    monkeypatch.setenv("SSL_CERT_FILE", str(system_ca[0]))
    server = TlsStandIn(*cert, status=403, body={"kind": "Status", "code": 403}).start()
    yield server, system_ca[0]
    server.stop()


def _run_publisher(kc: str, workdir: Path, sub: str) -> Publisher:
    d = workdir / sub
    d.mkdir()
    return Publisher(kc, d).start(wait=False)


def _authorizations(server: TlsStandIn) -> list[str]:
    return [s.headers.get("authorization", "") for s in server.requests()]


@pytest.mark.parametrize("ca_form", ["the cluster's CA", "an empty CA file"])
def test_an_impostor_the_system_store_trusts_never_receives_the_token(impostor, pki: Pki, workdir: Path,
                                                                      ca_form: str):
    server, system_ca = impostor
    token = "tok-" + secrets.token_hex(16)
    if ca_form == "an empty CA file":
        ca_file = workdir / "empty-ca.crt"
        ca_file.write_bytes(b"")
    else:
        ca_file = pki.ca("cluster-ca")[0]
    kc = kubeconfig(workdir / "kc", server.url, {"certificate-authority": str(ca_file)}, {"token": token})
    publisher = _run_publisher(kc, workdir, "attacked")
    try:
        if ca_form == "an empty CA file":  # refused at start, naming the field and the file
            wait_until("the publisher exits or reaches the impostor",
                       lambda: publisher.proc.poll() is not None or server.requests())
        else:  # it keeps trying, and every handshake is refused by the client
            wait_until("the publisher tried the impostor three times", lambda: len(server.snapshot()) >= 3)
        assert _authorizations(server) == [], "the impostor received a request"
        assert server.failed_handshakes() == len(server.snapshot())
        assert token not in publisher.logs()
        if ca_form == "an empty CA file":
            assert publisher.proc.returncode == 1, publisher.logs()
            assert f"certificate-authority {ca_file} is empty" in publisher.logs()
    finally:
        publisher.kill()

    # Positive control: with the impostor's CA in the kubeconfig, the token does reach it.
    trusting = kubeconfig(workdir / "kc-trusting", server.url, {"certificate-authority": str(system_ca)},
                          {"token": token})
    control = _run_publisher(trusting, workdir, "control")
    try:
        wait_until("the trusted server receives the token", lambda: f"Bearer {token}" in _authorizations(server))
    finally:
        control.kill()


def test_a_kubeconfig_naming_no_ca_trusts_the_system_store_as_client_go_and_says_so(impostor, workdir: Path):
    """Documented behaviour, as client-go's: with no CA named at all the system store decides, and
    the publisher warns at start that it does."""
    server, _ = impostor
    kc = kubeconfig(workdir / "kc", server.url, {}, {"token": "some-token"})
    publisher = _run_publisher(kc, workdir, "no-ca")
    try:
        wait_until("the system-trusted server is reached", lambda: server.requests())
        assert "names no certificate-authority" in publisher.logs()
    finally:
        publisher.kill()


def test_insecure_skip_tls_verify_with_a_ca_is_refused(pki: Pki, workdir: Path):
    ca = pki.ca("cluster-ca")[0]
    for cluster in ({"certificate-authority": str(ca)}, {"certificate-authority-data": "QUJD"}):
        kc = kubeconfig(workdir / "kc", "https://127.0.0.1:1", {**cluster, "insecure-skip-tls-verify": True},
                        {"token": "t"})
        with pytest.raises(apiclient.ConfigError, match="insecure-skip-tls-verify and certificate-authority"):
            apiclient.load(kc)
    # Positive control: either one alone is accepted.
    apiclient.load(kubeconfig(workdir / "kc1", "https://127.0.0.1:1", {"insecure-skip-tls-verify": True},
                              {"token": "t"}))
    apiclient.load(kubeconfig(workdir / "kc2", "https://127.0.0.1:1", {"certificate-authority": str(ca)},
                              {"token": "t"}))


@pytest.mark.parametrize("server_name", ["tls-server-name", "the URL's host"])
def test_a_name_only_in_the_certificates_common_name_is_refused(pki: Pki, workdir: Path, server_name: str):
    """As Go's TLS: a host name is matched against the subject alternative names only."""
    ca = pki.ca("cluster-ca")
    name = "api.cluster.internal" if server_name == "tls-server-name" else "localhost"

    def client_for(cert: tuple[Path, Path]) -> tuple[TlsStandIn, apiclient.ApiClient]:
        server = TlsStandIn(*cert).start()
        cluster = {"certificate-authority": str(ca[0])}
        url = server.url
        if server_name == "tls-server-name":
            cluster["tls-server-name"] = name
        else:
            url = f"https://localhost:{server.port}"
        kc = kubeconfig(workdir / f"kc-{cert[0].stem}", url, cluster, {"token": "t"})
        return server, apiclient.load(kc)

    cn_only, client = client_for(pki.leaf("cn-only", ca, cn=name, san=None))
    try:
        with pytest.raises(urllib3.exceptions.SSLError, match="certificate verify failed"):
            client.request("GET", "/version", timeout=10.0)
        assert cn_only.requests() == [], "a certificate naming the host only in its CN was accepted"
    finally:
        cn_only.stop()
    # Positive control: the same name in a SAN is accepted.
    with_san, client = client_for(pki.leaf("with-san", ca, cn=name, san=f"DNS:{name}"))
    try:
        assert client.request("GET", "/version", timeout=10.0).status == 200
        assert len(with_san.requests()) == 1
    finally:
        with_san.stop()


def test_token_file_wins_over_an_inline_token_as_in_client_go(pki: Pki, workdir: Path):
    ca = pki.ca("cluster-ca")
    server = TlsStandIn(*pki.leaf("api", ca, cn="127.0.0.1")).start()
    try:
        token_file = workdir / "token"
        token_file.write_text("from-the-file\n")
        both = kubeconfig(workdir / "kc", server.url, {"certificate-authority": str(ca[0])},
                          {"token": "inline-stale", "tokenFile": str(token_file)})
        apiclient.load(both).request("GET", "/version", timeout=10.0)
        # Positive control: the server sees the header, and an inline token alone is sent.
        inline = kubeconfig(workdir / "kc-inline", server.url, {"certificate-authority": str(ca[0])},
                            {"token": "inline-only"})
        apiclient.load(inline).request("GET", "/version", timeout=10.0)
        assert _authorizations(server) == ["Bearer from-the-file", "Bearer inline-only"]
    finally:
        server.stop()


@pytest.mark.parametrize("field", ["certificate-authority-data", "client-certificate"])
def test_a_named_but_empty_credential_field_is_an_error_naming_it(workdir: Path, field: str):
    empty = workdir / "empty"
    empty.write_bytes(b"\n")
    cluster, user = {}, {"token": "t"}
    if field == "certificate-authority-data":
        cluster[field] = "IAo="  # base64 of " \n"
    else:
        user.update({field: str(empty), "client-key": str(empty)})
    with pytest.raises(apiclient.ConfigError, match=f"{field}.* is empty"):
        apiclient.load(kubeconfig(workdir / "kc", "https://127.0.0.1:1", cluster, user))
