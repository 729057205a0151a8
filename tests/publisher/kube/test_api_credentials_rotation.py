"""A rotated CA bundle or client certificate is picked up from disk without a restart.

The API server here is a local TLS server (tests/publisher/tls_standin.py) that switches, like a
real one whose certificates were rotated, to a serving certificate of a new CA, or to trusting
client certificates of a new client CA. The files the kubeconfig names are then replaced (a
rename, as a rotation tool writes them); the same client object must get through again.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from publisher.kube.calls import Credentials, Kube, TransientError
from publisher_testkit import wait_until
from tls_standin import Pki, TlsStandIn, kubeconfig


def _install(source: Path, target: Path) -> None:
    """Replace `target` by a copy of `source` in one rename (never a half-written file)."""
    tmp = target.with_name(target.name + ".new")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _answers(kube: Kube) -> bool:
    try:
        return kube._request("get", "GET", "/version").status == 200
    except TransientError:
        return False


@pytest.mark.parametrize("rotated", ["the server's CA", "the client certificate"])
def test_a_rotated_ca_or_client_certificate_is_used_without_a_restart(workdir: Path, rotated: str):
    d = workdir / "pki"
    d.mkdir()
    pki = Pki(d)
    ca1, client_ca1 = pki.ca("ca1"), pki.ca("client-ca1")
    serving1, client1 = pki.leaf("serving1", ca1, cn="127.0.0.1"), pki.leaf("client1", client_ca1, cn="node-a",
                                                                              san=None, client=True)
    files = workdir / "credentials"
    files.mkdir()
    ca_file, cert_file, key_file = files / "ca.crt", files / "client.crt", files / "client.key"
    for source, target in ((ca1[0], ca_file), (client1[0], cert_file), (client1[1], key_file)):
        _install(source, target)
    server = TlsStandIn(*serving1, client_ca=client_ca1[0], body={"gitVersion": "v1.37.2"}).start()
    try:
        kc = kubeconfig(workdir / "kc", server.url, {"certificate-authority": "credentials/ca.crt"},
                        {"client-certificate": "credentials/client.crt", "client-key": "credentials/client.key"})
        credentials = Credentials(kc)
        kube = Kube(credentials.loader(kc, 2), credentials=credentials)
        assert _answers(kube)

        if rotated == "the server's CA":
            ca2 = pki.ca("ca2")
            server.rotate(*pki.leaf("serving2", ca2, cn="127.0.0.1"), client_ca=client_ca1[0])
            new_files = [(ca2[0], ca_file)]
        else:
            client_ca2 = pki.ca("client-ca2")
            server.rotate(*serving1, client_ca=client_ca2[0])
            client2 = pki.leaf("client2", client_ca2, cn="node-a", san=None, client=True)
            new_files = [(client2[1], key_file), (client2[0], cert_file)]
        # Positive control: the server's rotation is real, the old files no longer get through.
        assert not _answers(kube), "the rotated server still accepted the old credentials"

        for source, target in new_files:
            _install(source, target)
        wait_until("the client gets through with the rotated files", lambda: _answers(kube), timeout=30)
        assert credentials.reloads >= 1
    finally:
        server.stop()
