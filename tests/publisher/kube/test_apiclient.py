"""The publisher's own API client against the real kube-apiserver: every credential form a node agent
is given works, what it is never given is refused clearly, and the kubernetes package stays unloaded."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import urllib3

from publisher.kube import apiclient

REPO = Path(__file__).resolve().parents[3]


def _kubeconfig(path: Path, server: str, cluster: dict, user: dict) -> str:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "k", "cluster": {"server": server, **cluster}}],
           "users": [{"name": "u", "user": user}],
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    path.write_text(json.dumps(doc))  # JSON is YAML
    return str(path)


def _namespaces(client: apiclient.ApiClient) -> int:
    return client.request("GET", "/api/v1/namespaces", query=[("limit", "1")]).status


def test_token_kubeconfig_lists_and_the_kubernetes_package_is_never_imported(control_plane, tmp_path):
    kc = _kubeconfig(tmp_path / "kc", control_plane.server, {"certificate-authority": control_plane.ca_file},
                     {"token": control_plane.token("admin") + "\n"})
    code = ("import sys, resource; from publisher import cli, service; from publisher.kube import calls as kube; "
            "k = kube.Kube(cli.api_client_for(sys.argv[1], 4)); "
            "r = k._request('get', 'GET', '/api/v1/namespaces', query=[('limit', '1')]); "
            "print(r.status, 'kubernetes' in sys.modules, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)")
    out = subprocess.run([sys.executable, "-c", code, kc], capture_output=True, text=True, timeout=60,
                         cwd=REPO, check=True).stdout.split()
    assert out[:2] == ["200", "False"], out
    # A token file written by `echo` ends in a newline: stripped, not sent as an invalid header.
    assert _namespaces(apiclient.load(kc)) == 200


def test_token_file_relative_to_a_second_kubeconfig_file(control_plane, tmp_path):
    (tmp_path / "users").mkdir()
    (tmp_path / "users" / "token").write_text(control_plane.token("admin") + "\n")
    clusters = _kubeconfig(tmp_path / "clusters", control_plane.server,
                           {"certificate-authority": control_plane.ca_file}, {"token": "not-this-one"})
    doc = json.loads(Path(clusters).read_text())
    doc["users"] = []  # this file names the context; the user comes from the second file
    Path(clusters).write_text(json.dumps(doc))
    users = {"apiVersion": "v1", "kind": "Config", "users": [{"name": "u", "user": {"tokenFile": "token"}}]}
    (tmp_path / "users" / "kc").write_text(json.dumps(users))
    client = apiclient.load(os.pathsep.join([clusters, str(tmp_path / "users" / "kc")]))
    assert _namespaces(client) == 200


def test_in_cluster_service_account(control_plane, tmp_path, monkeypatch):
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(control_plane.token("admin"))
    (sa / "ca.crt").write_bytes(Path(control_plane.ca_file).read_bytes())
    url = urllib3.util.parse_url(control_plane.server)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", url.host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(url.port))
    assert _namespaces(apiclient.ApiClient(apiclient.in_cluster(str(sa)))) == 200
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(apiclient.ConfigError, match="not in a pod"):
        apiclient.in_cluster(str(sa))


def test_a_wrong_ca_is_no_answer_and_a_wrong_token_is_401(control_plane, tmp_path):
    other_ca = tmp_path / "ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=other",
                    "-keyout", str(tmp_path / "ca.key"), "-out", str(other_ca)], check=True, capture_output=True)
    bad_ca = apiclient.load(_kubeconfig(tmp_path / "kc1", control_plane.server, {"certificate-authority": str(other_ca)},
                                        {"token": control_plane.token("admin")}))
    with pytest.raises(urllib3.exceptions.HTTPError):
        bad_ca.request("GET", "/version", timeout=5.0)
    bad_token = apiclient.load(_kubeconfig(tmp_path / "kc2", control_plane.server,
                                           {"certificate-authority-data": base64.b64encode(
                                               Path(control_plane.ca_file).read_bytes()).decode()},
                                           {"token": "wrong"}))
    assert bad_token.request("GET", "/api/v1/namespaces").status == 401


def test_client_certificate_data_is_loaded_and_a_mismatched_key_refused(control_plane, tmp_path):
    def pair(name: str) -> tuple[bytes, bytes]:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                        "-keyout", str(tmp_path / f"{name}.key"), "-out", str(tmp_path / f"{name}.crt")],
                       check=True, capture_output=True)
        return (tmp_path / f"{name}.crt").read_bytes(), (tmp_path / f"{name}.key").read_bytes()

    (cert, key), (_, other_key) = pair("a"), pair("b")
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    good = _kubeconfig(tmp_path / "kc", control_plane.server, {"certificate-authority": control_plane.ca_file},
                       {"client-certificate-data": b64(cert), "client-key-data": b64(key),
                        "token": control_plane.token("admin")})
    assert _namespaces(apiclient.load(good)) == 200  # the handshake carries the certificate
    bad = _kubeconfig(tmp_path / "kc-bad", control_plane.server, {"certificate-authority": control_plane.ca_file},
                      {"client-certificate-data": b64(cert), "client-key-data": b64(other_key)})
    with pytest.raises(apiclient.ConfigError, match="client certificate or key"):
        apiclient.load(bad)


@pytest.mark.parametrize("user,match", [
    ({"exec": {"command": "get-token"}}, "exec is not supported"),
    ({"auth-provider": {"name": "oidc"}}, "auth-provider is not supported"),
    ({"username": "a", "password": "b"}, "username is not supported"),
])
def test_credentials_a_node_agent_is_never_given_are_refused_by_name(control_plane, tmp_path, user, match):
    kc = _kubeconfig(tmp_path / "kc", control_plane.server, {"certificate-authority": control_plane.ca_file}, user)
    with pytest.raises(apiclient.ConfigError, match=match):
        apiclient.load(kc)


def test_plain_http_and_missing_files_are_refused(tmp_path):
    with pytest.raises(apiclient.ConfigError, match="https:// URL is required"):
        apiclient.load(_kubeconfig(tmp_path / "kc", "http://127.0.0.1:8080", {}, {"token": "t"}))
    with pytest.raises(apiclient.ConfigError, match="certificate-authority .*missing-ca"):
        apiclient.load(_kubeconfig(tmp_path / "kc2", "https://127.0.0.1:1", {"certificate-authority": "missing-ca"},
                                   {"token": "t"}))
    with pytest.raises(apiclient.ConfigError, match="no kubeconfig"):
        apiclient.from_kubeconfig("")


def test_a_token_never_shows_in_the_endpoints_repr():
    ep = apiclient.Endpoint(server="https://a:1", token="secret-token-value", key_pem=b"KEY")
    assert "secret-token-value" not in repr(ep) and "KEY" not in repr(ep)
