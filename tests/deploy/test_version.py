"""One version: cni_plugin.__version__ is the package's, the chart's, the image's, both CLIs' and the
changelog's newest section; scripts/release.sh refuses any other."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest
import yaml

import cni_plugin
from chartlib import CHART
from deploylib import CONF, REPO, load_yaml_docs, netclaim_publisher_bin, python_env

VERSION = cni_plugin.__version__


def test_package_version_is_read_from_the_one_constant() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert cfg["metadata"]["version"] == "attr: cni_plugin.wire.version.__version__"
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


def test_both_clis_print_it() -> None:
    bindir = netclaim_publisher_bin().parent
    for cli in ("netclaim-publisher", "netclaim"):
        proc = subprocess.run([str(bindir / cli), "--version"], capture_output=True, text=True, env=python_env(),
                              timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split()[:2] == [cli, VERSION], proc.stdout


def test_the_changelog_has_this_version_on_top_and_the_previous_release() -> None:
    changelog = (REPO / "docs" / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[([0-9][^\]]*)\] - (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    assert released, "docs/CHANGELOG.md has no released version"
    assert released[0][0] == VERSION, f"the newest section of docs/CHANGELOG.md is {released[0][0]}, not {VERSION}"
    assert "0.1.0" in [v for v, _ in released]
    assert [d for _, d in released] == sorted((d for _, d in released), reverse=True), "sections not newest first"


def release_tree(tmp_path: Path, *, version: str = VERSION, chart_version: str = VERSION,
                 app_version: str = VERSION, changelog_version: str = VERSION) -> Path:
    """The files scripts/release.sh reads before it builds anything, in a tree of their own."""
    tree = tmp_path / "tree"
    for rel in ("scripts/release.sh", "cni_plugin/__init__.py", "cni_plugin/wire/__init__.py", "cni_plugin/wire/version.py", "conf/helm/netclaim/Chart.yaml", "docs/CHANGELOG.md"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tree / rel)
    init = tree / "cni_plugin" / "wire" / "version.py"
    init.write_text(init.read_text().replace(f'__version__ = "{VERSION}"', f'__version__ = "{version}"'))
    chart = tree / "conf" / "helm" / "netclaim" / "Chart.yaml"
    chart.write_text(chart.read_text().replace(f"\nversion: {VERSION}\n", f"\nversion: {chart_version}\n")
                     .replace(f'\nappVersion: "{VERSION}"\n', f'\nappVersion: "{app_version}"\n'))
    log = tree / "docs" / "CHANGELOG.md"
    log.write_text(log.read_text().replace(f"## [{VERSION}] - ", f"## [{changelog_version}] - "))
    return tree


@pytest.mark.parametrize("change, refusal", [
    ({}, "cni_plugin.__version__ is"),  # asked for another version than the project's
    ({"chart_version": "9.9.8"}, "Chart.yaml version is 9.9.8"),
    ({"app_version": "9.9.8"}, "Chart.yaml appVersion is 9.9.8"),
    ({"changelog_version": "9.9.8"}, "docs/CHANGELOG.md has no section"),
], ids=["other-version", "chart-version", "chart-app-version", "no-changelog-section"])
def test_release_refuses_a_version_that_is_not_the_projects_one(tmp_path: Path, change: dict[str, str],
                                                                refusal: str) -> None:
    tree = release_tree(tmp_path, **change)
    asked = "9.9.9" if not change else VERSION
    proc = subprocess.run(["bash", str(tree / "scripts" / "release.sh"), asked, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert refusal in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_release_refuses_a_work_tree_with_uncommitted_changes(tmp_path: Path) -> None:
    tree = release_tree(tmp_path)
    git = ["git", "-C", str(tree), "-c", "user.name=release test", "-c", "user.email=release-test@example.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "release tree"]):
        subprocess.run([*git, *args], check=True, capture_output=True, timeout=60)
    changelog = tree / "docs" / "CHANGELOG.md"
    changelog.write_text(changelog.read_text() + "\n")
    proc = subprocess.run(["bash", str(tree / "scripts" / "release.sh"), VERSION, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "uncommitted changes" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
