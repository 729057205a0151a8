"""The chart as an operator meets it: what it refuses, what it names, what it prints, what its docs say.

- `driverName` has no default: a render without it fails and says what to set (a wrong
  default would install fine and report nothing);
- every `helm install` / `helm template` command line in README.md, docs/install.md and the
  chart's README renders as written (through `helm template`);
- cluster-scoped APF objects are named per release, so two releases do not collide;
- NOTES names the node-scoped commands (the pod of a node, `status`, `resync`) with the
  release's namespace and labels, and those commands exist;
- extra volumes and mounts reach the containers; the chain keeper has a liveness probe;
- the chart's README is what scripts/build/chart_readme.py generates from values.yaml.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from chartlib import CHART, by_kind, driver_set, helm, kube_version, one, render
from deploylib import DRIVER, REPO, VENV_PYTHON, netclaim_publisher_bin, python_env

DOCS_WITH_HELM_COMMANDS = (REPO / "README.md", REPO / "docs" / "install.md", CHART / "README.md")
FAKE_DIGEST = "sha256:" + "0" * 64


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"] + pod["initContainers"]}


# ---------------------------------------------------------------- driverName is required


def test_values_yaml_has_no_default_driver() -> None:
    assert yaml.safe_load((CHART / "values.yaml").read_text())["driverName"] == ""


@pytest.mark.parametrize("sets", [(), ("driverName=",)], ids=["unset", "empty"])
def test_a_render_without_a_driver_name_is_refused_saying_what_to_set(sets: tuple[str, ...]) -> None:
    """`helm template` (and so `helm install` and `upgrade`, which render the same way) fails with a message
    that names the value and what to set. `helm lint` shows the same message; by helm's own rule a chart's
    `fail` is reported by lint, not fatal to it (lint renders charts without their required values)."""
    set_args = [a for s in sets for a in ("--set", s)]
    template = helm("template", "netclaim", str(CHART), "--kube-version", kube_version(), *set_args, check=False)
    lint = helm("lint", "--strict", str(CHART), "--kube-version", kube_version(), *set_args, check=False)
    assert template.returncode != 0, f"helm template rendered without a driverName:\n{template.stdout}"
    for proc in (template, lint):
        out = proc.stdout + proc.stderr
        assert "driverName is required" in out and "DeviceClass" in out and "--set driverName=" in out, out
    with pytest.raises(AssertionError, match="driverName is required"):
        render(*sets, driver=None)


def test_an_empty_list_of_drivers_is_refused() -> None:
    proc = helm("template", "netclaim", str(CHART), "--kube-version", kube_version(), "--set", "driverName={}",
                check=False)
    assert proc.returncode != 0, proc.stdout


def test_the_driver_given_is_the_one_rendered() -> None:
    docs = render(driver="nic.acme.io")
    assert one(docs, "ConfigMap")["data"]["NETCLAIM_DRIVER_NAME"] == "nic.acme.io"
    [rule] = [r for r in one(docs, "ClusterRole")["rules"] if r["resources"] == ["resourceclaims/driver"]]
    assert rule["resourceNames"] == ["nic.acme.io"]


# ---------------------------------------------------------------- the docs' helm command lines render


def helm_command_lines(text: str) -> list[str]:
    """`helm install|template|upgrade ...` lines of fenced shell blocks (continuations joined) and of inline
    code spans (which may wrap across lines in prose)."""
    found: list[str] = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M):
        logical = block.replace("\\\n", " ")
        found += [line.strip() for line in logical.splitlines()
                  if re.match(r"\s*helm (install|template|upgrade)\b", line)]
    prose = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.S | re.M)
    # A command line names a release first (`helm install --create-namespace` in prose is a flag, not one).
    found += [" ".join(span.split())
              for span in re.findall(r"`(helm (?:install|template|upgrade) [a-z0-9][^`]*)`", prose)]
    return found


def as_template(line: str) -> list[str]:
    """A documented helm command line as the `helm template` arguments that render what it would install."""
    line = re.sub(r"sha256:<[^>]*>", FAKE_DIGEST, line)  # a placeholder for the digest the reader pushed
    words = shlex.split(line, comments=True)
    for stop in (">", "|"):  # `> netclaim.yaml`, `| kubectl apply -f -`
        if stop in words:
            words = words[:words.index(stop)]
    assert words[0] == "helm" and words[1] in ("install", "template", "upgrade"), words
    release, chart, rest = words[2], words[3], words[4:]
    # The chart directory, a release's package of it (`helm package conf/helm/netclaim`) or that package pushed to
    # a registry (`oci://.../charts/netclaim@sha256:DIGEST` or `--version V`): rendered from the tree.
    assert (chart == "conf/helm/netclaim" or re.fullmatch(r"netclaim-[0-9][-.+0-9A-Za-z]*\.tgz", chart)
            or re.fullmatch(r"oci://[^ @]+/charts/netclaim(@sha256:(\.\.\.|[0-9a-f]{64}))?", chart)), line
    args = ["template", release, str(CHART)]
    drop_with_value = {"--timeout", "--version"}
    drop = {"--create-namespace", "--wait", "--atomic", "--install"}
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in drop:
            i += 1
            continue
        if word in drop_with_value:
            i += 2
            continue
        args.append(word)
        i += 1
    if "--kube-version" not in args:
        args += ["--kube-version", kube_version()]
    return args


def test_every_documented_helm_command_line_sets_a_driver_and_renders() -> None:
    lines = {doc.relative_to(REPO): helm_command_lines(doc.read_text()) for doc in DOCS_WITH_HELM_COMMANDS}
    assert all(lines.values()), f"a document lost its helm command lines: {lines}"
    for doc, commands in lines.items():
        for line in commands:
            assert "driverName=" in line, f"{doc}: {line!r} sets no driverName"
            proc = helm(*as_template(line), check=False)
            assert proc.returncode == 0, f"{doc}: {line!r} does not render:\n{proc.stderr}"
            # A line that shows only some templates (the systemd install's RBAC) renders those.
            assert ("kind: ClusterRole" if "--show-only" in line else "kind: DaemonSet") in proc.stdout, f"{doc}: {line!r}"


# ---------------------------------------------------------------- APF objects per release


def apf_names(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {kind: one(docs, kind)["metadata"]["name"] for kind in ("PriorityLevelConfiguration", "FlowSchema")}


def test_two_releases_get_apf_objects_of_their_own() -> None:
    a, b = render(release="edge-a"), render(release="edge-b")
    names_a, names_b = apf_names(a), apf_names(b)
    assert names_a == {"PriorityLevelConfiguration": "edge-a-netclaim-publisher",
                       "FlowSchema": "edge-a-netclaim-publisher"}, names_a
    assert set(names_a.values()).isdisjoint(names_b.values()), (names_a, names_b)
    for docs, names in ((a, names_a), (b, names_b)):
        schema = one(docs, "FlowSchema")["spec"]
        assert schema["priorityLevelConfiguration"]["name"] == names["PriorityLevelConfiguration"]
        [subject] = schema["rules"][0]["subjects"]
        assert subject["serviceAccount"]["name"] == one(docs, "ServiceAccount")["metadata"]["name"]
    # The release the plain manifests are rendered as keeps the name they always had; apf.name still wins.
    assert set(apf_names(render()).values()) == {"netclaim-publisher"}
    named = render("apf.name=site-publishers", release="edge-a")
    assert set(apf_names(named).values()) == {"site-publishers"}
    assert one(named, "FlowSchema")["spec"]["priorityLevelConfiguration"]["name"] == "site-publishers"
    assert not by_kind(render("apf.enabled=false"), "FlowSchema")


# ---------------------------------------------------------------- NOTES


def notes(*sets: str, release: str = "netclaim", namespace: str = "netclaim-system", tmp: Path) -> str:
    """NOTES.txt rendered by helm with the release's values and context. `helm template` leaves NOTES out, so a
    copy of the chart carries it as a named template and a ConfigMap holding its text."""
    chart = tmp / "netclaim"
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_under_test.tpl").write_text(
        '{{- define "notes.under.test" -}}\n' + text + '{{- end -}}\n')
    (chart / "templates" / "zz-notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-under-test\n"
        'data:\n  notes: {{ include "notes.under.test" . | toJson }}\n')
    docs = render(*sets, release=release, namespace=namespace, chart=chart)
    [cm] = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "notes-under-test"]
    return cm["data"]["notes"]


def test_notes_name_the_node_scoped_commands_with_the_releases_namespace_and_labels(tmp_root: Path) -> None:
    text = notes(release="edge", namespace="net-ops", tmp=tmp_root / "a")
    find = ("kubectl -n net-ops get pods -l app.kubernetes.io/name=netclaim,app.kubernetes.io/instance=edge "
            "--field-selector spec.nodeName=NODE -o name")
    assert find in text, text
    assert "kubectl -n net-ops exec POD -c publisher -- netclaim-publisher status\n" in text, text
    assert "kubectl -n net-ops exec POD -c publisher -- netclaim-publisher resync\n" in text, text
    assert f'exec "$({find})" -c publisher -- netclaim-publisher status' in text, text
    assert "helm uninstall edge -n net-ops" in text and "/docs" in text, text
    assert f"Driver(s): {DRIVER}\n" in text, text
    # The labels NOTES selects on are the DaemonSet pods' own.
    pod_labels = one(render(release="edge", namespace="net-ops"), "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/name"] == "netclaim" and pod_labels["app.kubernetes.io/instance"] == "edge"
    # Another socket dir: the commands name the socket the publisher serves.
    moved = notes("hostPaths.run=/run/netclaim-b", "nameOverride=nc", release="edge", namespace="net-ops",
                  tmp=tmp_root / "b")
    assert "netclaim-publisher status --socket=/run/netclaim-b/publisher.sock" in moved, moved
    assert "netclaim-publisher resync --socket=/run/netclaim-b/publisher.sock" in moved, moved
    assert "-l app.kubernetes.io/name=nc,app.kubernetes.io/instance=edge " in moved, moved


@pytest.mark.parametrize("run", ["/run/netclaim", "/run/netclaim-b"])
def test_status_execd_in_the_publisher_container_finds_its_socket_wherever_hostpaths_run_is(run: str) -> None:
    """The docs' `kubectl exec POD -c publisher -- netclaim-publisher status` names no socket: the container's
    environment does, as `status` and `resync` read it (NETCLAIM_SOCKET)."""
    env = {e["name"]: e.get("value") for e in containers(render(f"hostPaths.run={run}"))["publisher"]["env"]}
    assert env["NETCLAIM_SOCKET"] == f"{run}/publisher.sock", env
    for command in ("status", "resync"):
        proc = subprocess.run([str(netclaim_publisher_bin()), command, "--help"], capture_output=True, text=True,
                              env=python_env(), timeout=60)
        assert re.search(r"env var:\s+NETCLAIM_SOCKET\b", proc.stdout), proc.stdout


@pytest.mark.parametrize("command", ["status", "resync"])
def test_the_commands_notes_name_exist_with_the_socket_option(command: str) -> None:
    proc = subprocess.run([str(netclaim_publisher_bin()), command, "--help"], capture_output=True, text=True,
                          env=python_env(), timeout=60)
    assert proc.returncode == 0 and "--socket" in proc.stdout, proc.stdout + proc.stderr


# ---------------------------------------------------------------- extra volumes, keeper liveness


def test_extra_volumes_and_mounts_reach_the_pod_and_each_container() -> None:
    docs = render("extraVolumes[0].name=site-ca", "extraVolumes[0].secret.secretName=site-ca",
                  "publisher.extraVolumeMounts[0].name=site-ca",
                  "publisher.extraVolumeMounts[0].mountPath=/etc/netclaim/ca",
                  "publisher.extraVolumeMounts[0].readOnly=true",
                  "chainKeeper.extraVolumeMounts[0].name=site-ca",
                  "chainKeeper.extraVolumeMounts[0].mountPath=/etc/netclaim/ca")
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["volumes"][-1] == {"name": "site-ca", "secret": {"secretName": "site-ca"}}
    found = containers(docs)
    assert found["publisher"]["volumeMounts"][-1] == {"name": "site-ca", "mountPath": "/etc/netclaim/ca",
                                                      "readOnly": True}
    assert found["chain-keeper"]["volumeMounts"][-1] == {"name": "site-ca", "mountPath": "/etc/netclaim/ca"}
    assert all(m["name"] != "site-ca" for m in found["install"]["volumeMounts"])
    default = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    assert "site-ca" not in {v["name"] for v in default["volumes"]}


@pytest.mark.parametrize("bad", ["extraVolumes[0].name=tmp", "extraVolumes[0].name=state",
                                 "publisher.extraVolumeMounts[0].name=x",
                                 "chainKeeper.extraVolumeMounts[0].mountPath=relative"])
def test_an_extra_volume_taking_a_charts_name_or_a_mount_without_a_path_is_refused(bad: str) -> None:
    proc = helm("template", "netclaim", str(CHART), "--kube-version", kube_version(), *driver_set(),
                "--set", bad, check=False)
    assert proc.returncode != 0 and "values don't meet the specifications" in proc.stderr, proc.stderr


def test_the_chain_keeper_has_a_liveness_probe_on_its_probe_listener() -> None:
    for sets, host in (((), {"host": "127.0.0.1"}), (("metrics.probeHost=node",), {})):
        keeper = containers(render(*sets, "probes.mode=tcp", "metrics.keeperProbePort=19467"))["chain-keeper"]
        for kind in ("startupProbe", "livenessProbe"):
            assert keeper[kind]["httpGet"] == {**host, "path": "/healthz", "port": 19467}, (kind, keeper[kind])
        live = keeper["livenessProbe"]
        # Restarted only after its loop stood still past the keeper's own limit (60 s) plus a minute of failed
        # probes, which also covers a surge rollout's hand-over of the node's probe port between two keepers.
        assert live["periodSeconds"] * live["failureThreshold"] >= 60 and live["timeoutSeconds"] >= 1
        assert keeper["readinessProbe"]["httpGet"]["path"] == "/readyz"
    keeper = containers(render())["chain-keeper"]  # probes.mode=exec, the default: its socket, same thresholds
    for kind in ("startupProbe", "livenessProbe"):
        assert keeper[kind]["exec"]["command"][-2:] == ["/host/netclaim/run/keeper-probe.sock", "/healthz"], kind
    live = keeper["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 60 and live["timeoutSeconds"] >= 1


# ---------------------------------------------------------------- the generated chart README


def chart_readme_module() -> Any:
    spec = importlib.util.spec_from_file_location("chart_readme", REPO / "scripts" / "build" / "chart_readme.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_committed_chart_readme_is_what_the_generator_writes() -> None:
    proc = subprocess.run([str(VENV_PYTHON), str(REPO / "scripts" / "build" / "chart_readme.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (
        "conf/helm/netclaim/README.md is stale: run scripts/build/chart_readme.py (or scripts/build/manifests.sh)"
        f"\n{proc.stderr[-4000:]}")


def test_the_chart_readme_lists_every_value_with_its_default_and_comment(tmp_root: Path) -> None:
    gen = chart_readme_module()
    text = gen.readme()
    assert text == gen.readme(), "the generator is not deterministic"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    keys = re.findall(r"^\| `([^`]+)` \|", text, re.M)
    assert set(values) <= {k.split(".")[0] for k in keys}, set(values) - {k.split(".")[0] for k in keys}
    [driver] = [line for line in text.splitlines() if line.startswith("| `driverName` |")]
    assert '| `""` |' in driver and "Required" in driver and "DeviceClass" in driver, driver
    assert '| `cni.pollInterval` | `1` |' in text and "| `apf.priorityLevel.queues` | `16` |" in text
    # A changed comment or default shows in the next generation (and so fails the staleness check).
    chart = tmp_root / "netclaim"
    shutil.copytree(CHART, chart)
    values_file = chart / "values.yaml"
    values_file.write_text(values_file.read_text().replace("  pollInterval: 1\n", "  pollInterval: 2\n"))
    assert "| `cni.pollInterval` | `2` |" in gen.readme(chart)
    # helm reads it as the chart's README.
    shown = helm("show", "readme", str(CHART)).stdout
    assert shown.strip() == (CHART / "README.md").read_text().strip()
