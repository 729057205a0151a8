"""Exec credential plugins: `fleet` works with a managed cluster's kubeconfig; the node agent never runs one.

Unit half: the plugin runs with the kubeconfig's args and env and KUBERNETES_EXEC_INFO (not
interactive; the cluster's details when provideClusterInfo asks), its token or client
certificate becomes the credential, and every way it can fail (not found, a non-zero exit, not an
ExecCredential, an expired token, hanging past 120 s, not starting at all) is one clear error that names
the plugin and never repeats what it printed. The last two are pytest-subprocess's stand-in processes:
a real plugin cannot be made to outlast the real bound cheaply, nor to fail to fork on demand. The node agent's loader refuses `exec` without running it.
Real half: `netclaim-publisher fleet` with a kubeconfig whose user is an exec plugin reads the
real API server; a plugin that hands out a wrong token is an API error (exit 3), not a crash.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from publisher import cli
from publisher.kube import execcred
from publisher.kube.apiclient import ConfigError, from_kubeconfig
from publisher.observe import fleet as fleetmod

API = "client.authentication.k8s.io/v1"
CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def plugin(tmp_path: Path, body: str) -> Path:
    """An executable plugin: `body` is Python that may read sys.argv, os.environ and write `seen`."""
    path = tmp_path / "get-token"
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\nseen = {str(tmp_path / 'seen.json')!r}\n"
                    "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open(seen, 'w'))\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def kubeconfig(tmp_path: Path, exec_spec: dict[str, Any], server: str = "https://127.0.0.1:6443",
               cluster_extra: dict[str, Any] | None = None, ca_file: str | None = None) -> str:
    cluster: dict[str, Any] = {"server": server, **(cluster_extra or {})}
    if ca_file:
        cluster["certificate-authority"] = ca_file
    else:
        cluster["certificate-authority-data"] = base64.b64encode(CA).decode()
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "c", "cluster": cluster}],
           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
           "users": [{"name": "u", "user": {"exec": {"apiVersion": API, **exec_spec}}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def prints(status: dict[str, Any], api: str = API) -> str:
    return f"print(json.dumps({{'apiVersion': {api!r}, 'kind': 'ExecCredential', 'status': {status!r}}}))\n"


def seen(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "seen.json").read_text())


def test_the_plugins_token_is_the_credential_and_it_is_run_as_kubectl_runs_it(tmp_path: Path) -> None:
    cmd = plugin(tmp_path, prints({"token": "tok-123"}))
    ep = from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd), "args": ["--region", "x"],
                                               "env": [{"name": "PROFILE", "value": "ops"}],
                                               "provideClusterInfo": True},
                                    cluster_extra={"tls-server-name": "api.internal"}), allow_exec=True)
    assert ep.token == "tok-123"
    run = seen(tmp_path)
    assert run["argv"] == ["--region", "x"] and run["env"]["PROFILE"] == "ops"
    info = json.loads(run["env"]["KUBERNETES_EXEC_INFO"])
    assert info["apiVersion"] == API and info["kind"] == "ExecCredential" and info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert info["spec"]["cluster"]["tls-server-name"] == "api.internal"
    assert base64.b64decode(info["spec"]["cluster"]["certificate-authority-data"]) == CA


def test_cluster_details_go_to_the_plugin_only_when_it_asks(tmp_path: Path) -> None:
    cmd = plugin(tmp_path, prints({"token": "t"}))
    from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd)}), allow_exec=True)
    assert "cluster" not in json.loads(seen(tmp_path)["env"]["KUBERNETES_EXEC_INFO"])["spec"]


def test_a_client_certificate_from_the_plugin_is_the_credential(tmp_path: Path) -> None:
    cmd = plugin(tmp_path, prints({"clientCertificateData": "CERT PEM", "clientKeyData": "KEY PEM"}))
    ep = from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd)}), allow_exec=True)
    assert (ep.cert_pem, ep.key_pem, ep.token) == (b"CERT PEM", b"KEY PEM", "")


@pytest.mark.parametrize("body, spec, says", [
    ("print('secret-xyz'); sys.exit(2)\n", {}, "exited 2"),
    ("print('secret-xyz')\n", {}, "not JSON"),
    (prints({"token": "secret-xyz"}, api="client.authentication.k8s.io/v1beta1"), {}, "printed apiVersion"),
    (prints({"clientCertificateData": "secret-xyz"}), {}, "only one of"),
    (prints({}), {}, "neither a token nor a client certificate"),
    (prints({"token": "secret-xyz"}), {"interactiveMode": "Always"}, "interactiveMode Always"),
    (prints({"token": "secret-xyz"}), {"apiVersion": "client.authentication.k8s.io/v1alpha1"}, "apiVersion"),
    (prints({"token": "secret\nxyz"}), {}, "token"),
])
def test_a_plugin_that_gives_no_usable_credential_is_one_clear_error(tmp_path: Path, body: str,
                                                                    spec: dict[str, Any], says: str) -> None:
    cmd = plugin(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd), **spec}), allow_exec=True)
    assert says in str(err.value)
    assert "secret" not in str(err.value), "what the plugin printed is a credential: never in an error"


def test_a_missing_plugin_names_its_install_hint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found: install the cloud CLI"):
        from_kubeconfig(kubeconfig(tmp_path, {"command": str(tmp_path / "absent"),
                                              "installHint": "install the cloud CLI"}), allow_exec=True)


def test_a_relative_command_is_the_one_beside_the_kubeconfig_wherever_fleet_runs(tmp_path: Path,
                                                                               monkeypatch) -> None:
    """As kubectl: `./bin/get-token` is relative to the kubeconfig file's directory, not to the
    current one; a bare name is looked up in PATH."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    for where, token in ((home, "from-beside-the-kubeconfig"), (elsewhere, "from-the-current-directory")):
        (where / "bin").mkdir(parents=True)
        plugin(where / "bin", prints({"token": token}))
    config = kubeconfig(home, {"command": "./bin/get-token"})
    monkeypatch.chdir(elsewhere)  # which has a bin/get-token of its own
    assert from_kubeconfig(config, allow_exec=True).token == "from-beside-the-kubeconfig"
    assert not (elsewhere / "bin" / "seen.json").exists(), "the current directory's plugin ran"
    monkeypatch.setenv("PATH", f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert from_kubeconfig(kubeconfig(home, {"command": "get-token"}), allow_exec=True).token \
        == "from-beside-the-kubeconfig"


def test_a_plugin_that_hangs_is_stopped_and_its_args_are_not_repeated(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(execcred, "TIMEOUT", 0.5)
    cmd = plugin(tmp_path, "import time; time.sleep(60)\n")
    with pytest.raises(ConfigError) as err:
        from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd), "args": ["--client-secret", "secret-xyz"]}),
                        allow_exec=True)
    assert "gave no credential within" in str(err.value) and str(cmd) in str(err.value)
    assert "secret" not in str(err.value), "a plugin's args may hold a secret: never in an error"


def test_a_plugin_that_prints_an_expired_token_is_one_clear_error(tmp_path: Path) -> None:
    """A cloud CLI whose cached login ran out may still print its last token: the operator reads that the
    plugin's credential has expired (and when), not an API server's 401 for a token that looks fine."""
    cmd = plugin(tmp_path, prints({"token": "secret-xyz", "expirationTimestamp": "2020-01-02T03:04:05Z"}))
    with pytest.raises(ConfigError) as err:
        from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd)}), allow_exec=True)
    assert "expired at 2020-01-02T03:04:05Z" in str(err.value) and str(cmd) in str(err.value)
    assert "secret" not in str(err.value), "what the plugin printed is a credential: never in an error"


@pytest.mark.parametrize("expiry", ["2999-01-01T00:00:00Z", "2999-01-01T00:00:00.123456+02:00", None])
def test_a_token_that_has_not_expired_is_the_credential(tmp_path: Path, expiry: str | None) -> None:
    status = {"token": "tok-valid", **({"expirationTimestamp": expiry} if expiry else {})}
    cmd = plugin(tmp_path, prints(status))
    assert from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd)}), allow_exec=True).token == "tok-valid"


def test_an_expiry_that_is_not_a_time_is_one_clear_error(tmp_path: Path) -> None:
    cmd = plugin(tmp_path, prints({"token": "secret-xyz", "expirationTimestamp": "tomorrow"}))
    with pytest.raises(ConfigError, match="expirationTimestamp that is not an RFC 3339 time") as err:
        from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd)}), allow_exec=True)
    assert "secret" not in str(err.value)


# What a real plugin cannot be made to do on demand, through pytest-subprocess's stand-in process: run
# past the real bound (120 s: the real hang above runs with a shortened one), and fail to start for a
# reason other than not being there (the system out of processes, which root's limits never reach).


def test_a_plugin_still_running_at_the_real_bound_is_killed_and_the_bound_named(tmp_path: Path, fp,
                                                                                monkeypatch) -> None:
    from pytest_subprocess.fake_popen import FakePopen

    cmd = tmp_path / "get-token"
    bounds: list[float | None] = []
    communicate = FakePopen.communicate

    def waited(self, input=None, timeout=None):  # Popen.communicate's own signature
        bounds.append(timeout)
        return communicate(self, input, timeout)

    def hangs(process) -> None:  # still running when the bound is reached
        raise subprocess.TimeoutExpired(process.args, execcred.TIMEOUT)

    monkeypatch.setattr(FakePopen, "communicate", waited)
    recorder = fp.register([str(cmd), "--client-secret", "secret-xyz"], callback=hangs)
    with pytest.raises(ConfigError) as err:
        from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd), "args": ["--client-secret", "secret-xyz"]}),
                        allow_exec=True)
    assert "gave no credential within 120 s (stopped)" in str(err.value)
    assert str(cmd) in str(err.value) and "secret" not in str(err.value)
    assert bounds == [120.0], "the plugin is waited for 120 s"
    [process] = recorder.calls
    assert signal.SIGKILL in process.received_signals(), "the plugin was left running"


def test_a_plugin_the_system_cannot_start_is_one_clear_error(tmp_path: Path, fp) -> None:
    cmd = tmp_path / "get-token"

    def cannot_fork(_process) -> None:
        raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))

    fp.register([str(cmd)], callback=cannot_fork)
    with pytest.raises(ConfigError) as err:
        from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd)}), allow_exec=True)
    assert f"user 'u' exec plugin {str(cmd)!r}: BlockingIOError: [Errno {errno.EAGAIN}] " in str(err.value)
    assert "Traceback" not in str(err.value)


def test_the_node_agent_refuses_an_exec_user_without_running_it(tmp_path: Path) -> None:
    cmd = plugin(tmp_path, prints({"token": "t"}))
    with pytest.raises(ConfigError, match="exec is not supported"):
        from_kubeconfig(kubeconfig(tmp_path, {"command": str(cmd)}))
    assert not (tmp_path / "seen.json").exists(), "the node agent ran an exec plugin"


# ---------------------------------------------------------------- against the real API server


def admin_token_and_ca(control_plane) -> tuple[str, str, str]:
    doc = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    [cluster] = [c["cluster"] for c in doc["clusters"]]
    [user] = [u["user"] for u in doc["users"]]
    base = Path(control_plane.kubeconfig).parent
    ca = cluster["certificate-authority"]
    return user["token"], cluster["server"], str(ca if Path(ca).is_absolute() else base / ca)


def run_fleet(path: str, namespace: str) -> Any:
    return CliRunner().invoke(cli.cli, ["fleet", "--kubeconfig", path, "-n", namespace,
                                        "-l", "netclaim-test/fleet=none-such", "-o", "json"])


@pytest.mark.controlplane
def test_fleet_reads_the_real_api_server_through_an_exec_plugin(control_plane, cluster, tmp_path: Path) -> None:
    token, server, ca = admin_token_and_ca(control_plane)
    body = ("info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
            "assert info['spec']['interactive'] is False\n"
            + prints({"token": "__TOKEN__"}).replace("'__TOKEN__'", "os.environ['HANDED_OUT']"))
    cmd = plugin(tmp_path, body)
    good = kubeconfig(tmp_path, {"command": str(cmd), "env": [{"name": "HANDED_OUT", "value": token}]},
                      server=server, ca_file=ca)
    result = run_fleet(good, cluster.namespace)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["nodes"] == []

    bad = kubeconfig(tmp_path, {"command": str(cmd), "env": [{"name": "HANDED_OUT", "value": "not-a-token"}]},
                     server=server, ca_file=ca)
    result = run_fleet(bad, cluster.namespace)
    assert result.exit_code == fleetmod.EXIT_API, result.output
    assert "401" in result.output and "not-a-token" not in result.output
