"""One version: cni_plugin.__version__ is the package's, the chart's, the image's and both CLIs'."""

from __future__ import annotations

import configparser
import subprocess
from importlib.metadata import version as dist_version

import yaml

import cni_plugin
from chartlib import CHART
from deploylib import CONF, REPO, load_yaml_docs, netclaim_publisher_bin, python_env

VERSION = cni_plugin.__version__


def test_package_version_is_read_from_the_one_constant() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert cfg["metadata"]["version"] == "attr: cni_plugin.__version__"
    assert dist_version("netclaim") == VERSION


def test_chart_version_and_app_version_are_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == VERSION and chart["appVersion"] == VERSION


def test_generated_manifests_run_the_image_of_this_version() -> None:
    [ds] = [d for d in load_yaml_docs(CONF / "kubernetes" / "30-daemonset.yaml") if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {f"netclaim:{VERSION}"}


def test_image_builds_are_tagged_from_the_constant() -> None:
    script = (REPO / "scripts" / "build-image.sh").read_text()
    assert "cni_plugin.__version__" in script and 'TAG="${TAG:-$VERSION}"' in script
    assert "cni_plugin.__version__" in (CONF / "container" / "Containerfile").read_text()


def test_both_clis_print_it() -> None:
    bindir = netclaim_publisher_bin().parent
    for cli in ("netclaim-publisher", "netclaim"):
        proc = subprocess.run([str(bindir / cli), "--version"], capture_output=True, text=True, env=python_env(),
                              timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split()[:2] == [cli, VERSION], proc.stdout
