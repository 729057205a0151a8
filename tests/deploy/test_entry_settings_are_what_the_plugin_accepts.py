"""The netclaim entry an installer writes is one the plugin accepts, typed as the plugin reads it.

The chain keeper (and the one-shot installer's conflist editor) build the entry from KEY=VALUE
text: a chart value, an environment variable, `--set`. The plugin refuses its whole entry when a
field has the wrong JSON type (`"spoolMaxFiles": "500"` is ADD error 7, so no pod on the node
starts), so the text must become a JSON integer where the plugin reads one, and a value the
plugin would refuse must be refused before any file on the node is written. Every check here
reads the entry back with the plugin's own config parser, not a copy of its rules.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.config import parse_netconf
from deploylib import DRIVER, REPO, netclaim_publisher_bin, python_env
from publisher.keeper.conflist import BadSetting, build_entry, install

PRIMARY = {"cniVersion": "1.0.0", "name": "podnet", "plugins": [{"type": "bridge", "bridge": "cbr0"}]}


def write_primary(root: Path) -> Path:
    conflist = root / "net.d" / "10-podnet.conflist"
    conflist.parent.mkdir(parents=True, exist_ok=True)
    conflist.write_text(json.dumps(PRIMARY))
    return conflist


def netclaim_entry(conflist: Path) -> dict[str, Any]:
    [entry] = [p for p in json.loads(conflist.read_text())["plugins"] if p["type"] == "netclaim"]
    return entry


def as_the_plugin_reads(conflist: Path) -> Any:
    """The entry the way libcni hands it to the plugin (name and cniVersion of the conflist), parsed by the
    plugin's own parser for an ADD."""
    doc = json.loads(conflist.read_text())
    raw = {**netclaim_entry(conflist), "name": doc["name"], "cniVersion": doc["cniVersion"], "prevResult": {}}
    return parse_netconf(raw, doc["cniVersion"], "ADD")


def test_spool_and_handoff_settings_are_written_as_integers_that_the_plugin_parses(tmp_path: Path) -> None:
    conflist = write_primary(tmp_path)
    install(conflist, build_entry([f"driverName={DRIVER}", "spoolMaxFiles=500", "spoolMaxBytes=1048576",
                                   "ackTimeoutMs=250", "handoffWaitMs=0", "failurePolicy=Fail"]))
    entry = netclaim_entry(conflist)
    assert {k: entry[k] for k in ("spoolMaxFiles", "spoolMaxBytes", "ackTimeoutMs", "handoffWaitMs")} == {
        "spoolMaxFiles": 500, "spoolMaxBytes": 1048576, "ackTimeoutMs": 250, "handoffWaitMs": 0}
    assert entry["failurePolicy"] == "Fail" and entry["driverName"] == DRIVER  # strings stay strings
    conf = as_the_plugin_reads(conflist)
    assert (conf.spool_max_files, conf.spool_max_bytes) == (500, 1048576)
    assert (conf.ack_timeout, conf.handoff_wait) == (0.25, 0.0)


@pytest.mark.parametrize(("pair", "key", "says"), [
    ("spoolMaxFiles=lots", "spoolMaxFiles", "must be an integer between 1 and 16777216"),
    ("spoolMaxFiles=0", "spoolMaxFiles", "between 1 and 16777216"),
    ("spoolMaxBytes=1024", "spoolMaxBytes", "between 4096 and 1099511627776"),
    ("ackTimeoutMs=60001", "ackTimeoutMs", "between 1 and 60000"),
    ("handoffWaitMs=-1", "handoffWaitMs", "between 0 and 60000"),
    ("ackTimeoutMs=1_000", "ackTimeoutMs", "must be an integer"),  # int() would take it; JSON has no such number
    ("spoolMaxFiles=5.0", "spoolMaxFiles", "must be an integer"),
    ("failurePolicy=ignore", "failurePolicy", "must be one of Ignore, Fail"),
    ("socketPath=publisher.sock", "socketPath", "must be an absolute path"),
    # The plugin ignores top-level keys it does not read (runtimes add their own), so a typo of an
    # installer's setting would silently leave the default in force: refused, with the keys that exist.
    ("spoolMaxFile=500", "spoolMaxFile", "not a setting of the netclaim entry"),
    ("interface=mtu", "interface", "not a setting of the netclaim entry"),
])
def test_a_value_the_plugin_would_refuse_is_refused_naming_the_key(pair: str, key: str, says: str) -> None:
    with pytest.raises(BadSetting) as refused:
        build_entry([f"driverName={DRIVER}", pair])
    assert refused.value.key == key
    assert str(refused.value).startswith(f"{key}") and says in str(refused.value), str(refused.value)


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--plugin-spool-max-files", "lots", "spoolMaxFiles=lots: must be an integer between 1 and 16777216"),
    ("--plugin-handoff-wait-ms", "60001", "handoffWaitMs=60001: must be between 0 and 60000"),
])
def test_the_keeper_refuses_a_bad_setting_before_writing_anything_on_the_node(
        tmp_path: Path, option: str, value: str, says: str) -> None:
    """The init container's run (`chain-keeper --once`): it fails, names the key, the range and its own option,
    and the node's conflist and CNI bin dir are as they were."""
    conflist = write_primary(tmp_path)
    before = conflist.read_bytes()
    bin_d = tmp_path / "bin"
    bin_d.mkdir()
    plugin = tmp_path / "netclaim"
    plugin.write_bytes(Path("/bin/true").read_bytes())
    proc = subprocess.run([str(netclaim_publisher_bin()), "chain-keeper", "--once", f"--cni-conf-dir={conflist.parent}",
                           f"--cni-bin-dir={bin_d}", f"--plugin-binary={plugin}", f"--driver-name={DRIVER}",
                           "--cni-cache-dir=", f"{option}={value}"],
                          env=python_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and option in proc.stderr and "nothing was written" in proc.stderr, proc.stderr
    assert conflist.read_bytes() == before
    assert sorted(p.name for p in conflist.parent.iterdir()) == [conflist.name], "a backup or temp file was written"
    assert list(bin_d.iterdir()) == [], "the plugin was installed"


def test_an_emptied_keeper_setting_brings_the_plugins_default_back_and_keeps_what_the_operator_added(
        tmp_path: Path) -> None:
    """The keeper's settings are the chart's values, every one stated: an empty one is the plugin's default, so a
    cap an earlier install wrote goes and the plugin's default applies again; a key the keeper does not write (an
    `interface` block added by hand) stays."""
    conflist = write_primary(tmp_path)
    install(conflist, build_entry([f"driverName={DRIVER}", "spoolMaxFiles=50", "ackTimeoutMs=200"],
                                  empty_is_default=True))
    doc = json.loads(conflist.read_text())
    doc["plugins"][-1]["interface"] = {"mtu": 1400}
    conflist.write_text(json.dumps(doc))

    install(conflist, build_entry([f"driverName={DRIVER}", "spoolMaxFiles=", "ackTimeoutMs=200"],
                                  empty_is_default=True))
    entry = netclaim_entry(conflist)
    assert "spoolMaxFiles" not in entry and entry["ackTimeoutMs"] == 200 and entry["interface"] == {"mtu": 1400}
    assert as_the_plugin_reads(conflist).spool_max_files == 1024  # the plugin's own default


def test_an_empty_conflist_editor_setting_keeps_what_the_entry_holds(tmp_path: Path) -> None:
    """scripts/install.sh passes every option, given or not: an empty one is not given, and a re-run without
    it keeps the value an earlier run (or the operator) wrote."""
    conflist = write_primary(tmp_path)
    install(conflist, build_entry([f"driverName={DRIVER}", "spoolMaxFiles=50"]))
    install(conflist, build_entry([f"driverName={DRIVER}", "spoolMaxFiles="]))
    assert netclaim_entry(conflist)["spoolMaxFiles"] == 50


def test_an_unknown_key_is_refused_also_when_empty() -> None:
    with pytest.raises(BadSetting) as refused:
        build_entry([f"driverName={DRIVER}", "spoolMaxFile="])
    assert refused.value.key == "spoolMaxFile"


def test_a_string_cap_written_by_an_older_installer_is_replaced_by_the_integer(tmp_path: Path) -> None:
    """A node whose entry holds `"spoolMaxFiles": "500"` (which the plugin refuses) is repaired by the next
    install that names the setting."""
    conflist = write_primary(tmp_path)
    doc = json.loads(conflist.read_text())
    doc["plugins"].append({"type": "netclaim", "driverName": DRIVER, "spoolMaxFiles": "500"})
    conflist.write_text(json.dumps(doc))
    install(conflist, build_entry([f"driverName={DRIVER}", "spoolMaxFiles=500"]))
    assert netclaim_entry(conflist)["spoolMaxFiles"] == 500
    assert as_the_plugin_reads(conflist).spool_max_files == 500


def test_the_conflist_editor_writes_integers_and_refuses_a_bad_value(tmp_path: Path) -> None:
    """scripts/operator/conflist_edit.py, which scripts/install.sh runs: the same typing and refusal."""
    editor = [str(REPO / ".venv" / "bin" / "python"), str(REPO / "scripts" / "operator" / "conflist_edit.py")]
    conflist = write_primary(tmp_path)
    ok = subprocess.run([*editor, "install", "--conflist", str(conflist), "--set", f"driverName={DRIVER}",
                         "--set", "spoolMaxFiles=500"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert netclaim_entry(conflist)["spoolMaxFiles"] == 500
    before = conflist.read_bytes()
    bad = subprocess.run([*editor, "install", "--conflist", str(conflist), "--set", f"driverName={DRIVER}",
                          "--set", "spoolMaxFiles=lots"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "spoolMaxFiles=lots: must be an integer" in bad.stderr, bad.stderr
    assert conflist.read_bytes() == before
