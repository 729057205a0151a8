"""The CNI side of the harness: one bin dir, the conflists, netclaim's installation.

containerd 1.6 takes a single CNI bin_dir, so the reference plugins are linked
into a private one (it must hold `loopback`: containerd sets up lo itself with
it). The chain is a plain bridge + host-local network on a bridge and subnet
unique to this harness, so parallel runs on the same machine do not collide.
netclaim is added the way users add it: by scripts/install.sh, which installs
the static plugin into the bin dir and appends it as the last plugin.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .jsonlog import log

REPO = Path(__file__).resolve().parents[3]
INSTALL_SH = REPO / "scripts" / "install.sh"
REFERENCE_PLUGIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
NEEDED_PLUGINS = ("bridge", "host-local", "loopback")


@dataclass(frozen=True)
class Network:
    """A bridge network private to one harness."""

    name: str
    bridge: str
    subnet: str
    gateway: str
    ipam_dir: Path

    @classmethod
    def pick(cls, suffix: str, ipam_dir: Path) -> "Network":
        # 10.64.0.0/10 split into /24s at random: two harnesses on one machine
        # almost never pick the same subnet, and we check the routes anyway.
        taken = _routed_prefixes()
        for _ in range(64):
            second, third = random.randint(64, 127), random.randint(0, 255)
            subnet = f"10.{second}.{third}.0/24"
            if subnet not in taken:
                return cls(f"ncnet-{suffix}", f"ncbr-{suffix}"[:15], subnet, f"10.{second}.{third}.1", ipam_dir)
        raise RuntimeError("no free 10.64.0.0/10 subnet for the test bridge")


def _routed_prefixes() -> set[str]:
    out = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True, check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line}


def link_reference_plugins(bin_dir: Path) -> None:
    """Link every reference plugin into bin_dir (idempotent)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    source = next((d for d in REFERENCE_PLUGIN_DIRS if (d / "bridge").exists()), None)
    if source is None:
        raise RuntimeError("CNI reference plugins not found: install the Debian package containernetworking-plugins")
    for plugin in sorted(source.iterdir()):
        target = bin_dir / plugin.name
        if not target.exists():
            target.symlink_to(plugin)
    missing = [p for p in NEEDED_PLUGINS if not (bin_dir / p).exists()]
    if missing:
        raise RuntimeError(f"CNI plugins missing from {source}: {', '.join(missing)}")


def base_conflist(net: Network) -> dict:
    """bridge + host-local, as a cluster's default network would be."""
    return {
        "cniVersion": "1.0.0",
        "name": net.name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(net.ipam_dir),
                    "ranges": [[{"subnet": net.subnet, "gateway": net.gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


def write_conflist(path: Path, conflist: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(conflist, indent=2) + "\n")
    return path


@dataclass(frozen=True)
class NetclaimInstall:
    """What scripts/install.sh installs and how the netclaim entry is configured."""

    driver_name: str
    socket: Path
    spool_dir: Path
    state_dir: Path
    log_file: Path
    python: str = sys.executable  # runs the installer's conflist editor
    bundle: str = ""  # the plugin executable to install; "" = what scripts/build-plugin.sh builds


def install_netclaim(bin_dir: Path, conflist: Path, opts: NetclaimInstall) -> None:
    """Run the project's installer, as an operator would, against our dirs."""
    if not INSTALL_SH.exists():
        raise RuntimeError(f"{INSTALL_SH.relative_to(REPO)} does not exist yet: cannot put netclaim in the chain")
    cmd = [
        "bash", str(INSTALL_SH),
        "--cni-bin-dir", str(bin_dir),
        "--conflist", str(conflist),
        "--driver-name", opts.driver_name,
        "--socket", str(opts.socket),
        "--spool-dir", str(opts.spool_dir),
        "--state-dir", str(opts.state_dir),
        "--log-file", str(opts.log_file),
        "--drivers-file", str(opts.state_dir.parent / "drivers"),  # ours, not the machine's /etc/netclaim
        "--python", opts.python,
        *(["--bundle", opts.bundle] if opts.bundle else []),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    if done.returncode != 0:
        raise RuntimeError(f"scripts/install.sh failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    plugins = json.loads(conflist.read_text()).get("plugins", [])
    if not plugins or plugins[-1].get("type") != "netclaim":
        raise RuntimeError(f"scripts/install.sh did not append netclaim as the last plugin of {conflist}")
    log("netclaim.installed", bin_dir=str(bin_dir), conflist=str(conflist), driver=opts.driver_name)


def delete_bridge(name: str) -> None:
    """The bridge plugin never deletes its bridge; we created it, we remove it."""
    done = subprocess.run(["ip", "link", "delete", name, "type", "bridge"], capture_output=True, text=True)
    if done.returncode == 0:
        log("bridge.deleted", bridge=name)
