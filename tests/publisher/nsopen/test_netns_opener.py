"""The live watch works from a process that cannot enter namespaces, through the netns opener.

Real parts: the `netclaim-publisher netns-opener` process on a temporary socket, a real netns
with a veth `eth0` made by `ip netns`, and a consumer process that builds the publisher's own
`Sandbox` (publisher/live/sandbox.py) the way the watch does. The consumer runs without
CAP_SYS_ADMIN (`setpriv` drops it from its bounding and inheritable sets, and it reads its own
CapEff to prove it): what the publisher container of the chart is. It must still see the pod's
link go down, while the same process without the opener is refused setns (EPERM). A peer the
opener does not serve (uid 65534) gets nothing, one with the uid it was given gets its sockets.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from livewatch_kit import PodNetns, ip, made_pod_netns
from publisher_testkit import BIN, suffix, wait_until

pytestmark = pytest.mark.netns

CAP_SYS_ADMIN = 21
WITHOUT_SYS_ADMIN = ["setpriv", "--inh-caps=-all", "--bounding-set=-sys_admin", "--"]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
ALLOWED_UID = 4321

# The consumer: the publisher's Sandbox in a process of its own. It says what it is allowed
# (CapEff), then either how opening failed, or waits for the link to go down and says so.
CONSUMER = r"""
import errno, json, select, sys, time
from publisher.live.sandbox import Sandbox
from publisher.nsopen.access import NetnsAccess

path, opener = sys.argv[1], sys.argv[2]
capeff = int(next(l for l in open("/proc/self/status") if l.startswith("CapEff:")).split()[1], 16)
say = lambda **kw: print(json.dumps({"capeff": capeff, **kw}), flush=True)
try:
    box = Sandbox(path, NetnsAccess(opener=opener))
except OSError as exc:
    say(opened=False, errno=exc.errno, error=str(exc))
    sys.exit(0)
say(opened=True, up=box.observe("eth0").up)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    select.select([box], [], [], 1.0)
    box.drain()
    seen = box.observe("eth0")
    if not seen.up:
        say(opened=True, up=False, mac=seen.mac)
        break
"""


@pytest.fixture()
def pod_netns() -> Iterator[PodNetns]:
    with made_pod_netns("nso", None) as ns:
        yield ns


@dataclass
class Opener:
    socket: str
    proc: subprocess.Popen
    log: Path

    def logs(self) -> list[dict]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out


@pytest.fixture()
def opener(tmp_path: Path) -> Iterator[Opener]:
    run_dir = Path(tempfile.mkdtemp(prefix="nsopen-"))  # reachable by every uid: the opener itself decides
    run_dir.chmod(0o755)
    sock, log = str(run_dir / "netns.sock"), tmp_path / "opener.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(BIN / "netclaim-publisher"), "netns-opener", "--socket", sock,
                                 "--allowed-uid", str(ALLOWED_UID)], stdout=out, stderr=out)
    running = Opener(sock, proc, log)
    try:
        wait_until("the opener to serve", lambda: any(e.get("msg") == "netns opener serving" for e in running.logs())
                   or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, log.read_text()
        yield running
    finally:
        proc.terminate()
        proc.wait(15)
        shutil.rmtree(run_dir, ignore_errors=True)


def consumer(path: str, opener_socket: str, prefix: list[str]) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, "-c", CONSUMER, path, opener_socket],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def said(proc: subprocess.Popen) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"consumer said nothing (exit {proc.wait(30)}): {proc.stderr.read() if proc.stderr else ''}"
    return json.loads(line)


def has_sys_admin(answer: dict) -> bool:
    return bool(answer["capeff"] & (1 << CAP_SYS_ADMIN))


def test_a_process_without_sys_admin_follows_a_pod_link_through_the_opener(opener: Opener,
                                                                           pod_netns: PodNetns) -> None:
    proc = consumer(pod_netns.path, opener.socket, WITHOUT_SYS_ADMIN)
    try:
        first = said(proc)
        assert not has_sys_admin(first), first
        assert first["opened"] and first["up"] is True, first
        ip("-n", pod_netns.name, "link", "set", "eth0", "down")
        assert said(proc)["up"] is False
    finally:
        proc.kill()
        proc.wait(15)


def test_without_the_opener_the_same_process_cannot_enter_the_netns(pod_netns: PodNetns) -> None:
    """The control: what the opener gives is what this process could not get by itself."""
    proc = consumer(pod_netns.path, "", WITHOUT_SYS_ADMIN)
    answer = said(proc)
    proc.wait(30)
    assert not has_sys_admin(answer), answer
    assert answer["opened"] is False and answer["errno"] == 1, answer  # EPERM from setns


def test_the_opener_serves_root_and_its_allowed_uid_only(opener: Opener, pod_netns: PodNetns) -> None:
    refused = consumer(pod_netns.path, opener.socket, NOBODY)
    answer = said(refused)
    refused.wait(30)
    assert answer["opened"] is False and answer["errno"] == 13, answer  # EACCES: not served
    assert "uid 65534 is not allowed" in answer["error"], answer
    wait_until("the refusal logged with the peer's uid", lambda: any(
        e.get("msg", "").startswith("netns request refused") and e.get("uid") == 65534 for e in opener.logs()))

    # The control: a uid the opener was given is served, from the same socket.
    allowed = consumer(pod_netns.path, opener.socket,
                       ["setpriv", f"--reuid={ALLOWED_UID}", f"--regid={ALLOWED_UID}", "--clear-groups", "--"])
    try:
        answer = said(allowed)
        assert answer["opened"] is True and answer["up"] is True, answer
    finally:
        allowed.kill()
        allowed.wait(15)


def test_the_opener_opens_only_netns_in_its_directory(opener: Opener, pod_netns: PodNetns,
                                                      tmp_path: Path) -> None:
    """Asked for the host's netns by a /proc path, or a FIFO in the netns directory, it refuses at once."""
    fifo = f"/var/run/netns/nso-fifo-{suffix()}"
    subprocess.run(["mkfifo", fifo], check=True)
    try:
        for path in ("/proc/1/ns/net", fifo, f"/var/run/netns/{pod_netns.name}/../../../proc/1/ns/net"):
            proc = consumer(path, opener.socket, WITHOUT_SYS_ADMIN)
            answer = said(proc)
            proc.wait(30)
            assert answer["opened"] is False, (path, answer)
    finally:
        Path(fifo).unlink()
    proc = consumer(pod_netns.path, opener.socket, WITHOUT_SYS_ADMIN)
    try:
        assert said(proc)["opened"] is True  # and the opener still serves
    finally:
        proc.kill()
        proc.wait(15)
