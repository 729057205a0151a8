"""The kubelet's probes keep answering while a pod floods the metrics listener with slow connections.

The chart's pods are hostNetwork: the metrics listener is on the node's address, which every pod
of the node reaches. A pod that holds a few dozen connections open (connect, send half a request,
wait) keeps every handler and queue slot of that listener busy, and a probe sent there fails: the
kubelet would restart a healthy publisher. The probe listener (--probe-address 127.0.0.1:PORT)
has its own threads and is on the node's loopback, which no pod network reaches.

Real parts: the real publisher process; the "pod" is a real network namespace joined to the host
by a veth pair, and the flood comes from a process inside it.
"""

from __future__ import annotations

import random
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from publisher_testkit import Publisher, free_port, suffix, unreachable_kubeconfig, wait_until

pytestmark = [pytest.mark.netns]

FLOOD_CONNECTIONS = 64  # the metrics listener holds 4 handlers + 16 queued: far more than that

# Runs inside the pod's netns: hold FLOOD connections with a partial request each, and open a new
# one for every connection the server closes, until killed. Prints "holding" once all are open.
FLOODER = r"""
import selectors, socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sel = selectors.DefaultSelector()

def connect():
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never the final empty line
    except OSError:
        s.close()
        return
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)

for _ in range(count):
    connect()
print("holding", len(sel.get_map()), flush=True)
while True:
    for key, _ in sel.select(timeout=1.0):
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = b""
        if not data:
            sel.unregister(key.fileobj)
            key.fileobj.close()
    while len(sel.get_map()) < count:
        connect()
        time.sleep(0.005)
"""

# Runs inside the pod's netns: can the probe port be reached at all (node address, own loopback)?
REACH = r"""
import socket, sys
for host in sys.argv[1:-1]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, int(sys.argv[-1])))
        print(host, "connected")
    except OSError as exc:
        print(host, type(exc).__name__)
    finally:
        s.close()
"""


@pytest.fixture()
def pod_netns():
    """A network namespace joined to the host by a veth pair: (netns, node address, pod address)."""
    name, tag = f"ncpod-{suffix()}", suffix()
    octet = random.randint(16, 250)
    node_ip, pod_ip = f"10.231.{octet}.1", f"10.231.{octet}.2"
    host_if, pod_if = f"vh{tag}", f"vp{tag}"
    commands = [["ip", "netns", "add", name],
                ["ip", "link", "add", host_if, "type", "veth", "peer", "name", pod_if],
                ["ip", "link", "set", pod_if, "netns", name],
                ["ip", "addr", "add", f"{node_ip}/30", "dev", host_if],
                ["ip", "link", "set", host_if, "up"],
                ["ip", "-n", name, "addr", "add", f"{pod_ip}/30", "dev", pod_if],
                ["ip", "-n", name, "link", "set", pod_if, "up"],
                ["ip", "-n", name, "link", "set", "lo", "up"]]
    try:
        for cmd in commands:
            subprocess.run(cmd, check=True, capture_output=True, timeout=30)
        yield name, node_ip, pod_ip
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def probe(host: str, port: int, path: str = "/healthz", timeout: float = 5.0) -> int:
    """One probe as the kubelet sends it: the HTTP status, or 0 when no answer came."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def start_flood(netns: str, host: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", FLOODER, host, str(port),
                             str(FLOOD_CONNECTIONS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    assert line.startswith("holding"), f"the flood did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
    return proc


def test_probes_answer_while_a_pod_floods_the_metrics_listener(pod_netns, workdir: Path):
    netns, node_ip, _pod_ip = pod_netns
    metrics_port, probe_port = free_port(), free_port()
    publisher = Publisher(str(unreachable_kubeconfig(workdir)), workdir,
                          extra=["--metrics-address", f"{node_ip}:{metrics_port}",
                                 "--probe-address", f"127.0.0.1:{probe_port}"])
    publisher.start(wait=False)
    flood = None
    try:
        # Positive control, unflooded: both listeners answer the liveness probe.
        wait_until("the probe listener answers", lambda: publisher.proc.poll() is None
                   and probe("127.0.0.1", probe_port) == 200 or _exited(publisher))
        assert publisher.proc.poll() is None, publisher.logs()[-3000:]
        assert probe(node_ip, metrics_port) == 200
        assert probe("127.0.0.1", probe_port, "/metrics") == 404  # the probe listener serves probes only

        # No pod reaches the probe listener: not on the node's address, and the pod's own loopback is its own.
        reach = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", REACH, node_ip, "127.0.0.1",
                                str(probe_port)], capture_output=True, text=True, timeout=60, check=True).stdout
        assert "connected" not in reach, reach

        flood = start_flood(netns, node_ip, metrics_port)
        # Positive control, flooded: the metrics listener's own /healthz gets no answer (the attack is real).
        wait_until("the flooded metrics listener fails a probe", lambda: probe(node_ip, metrics_port, timeout=2) == 0)

        answers = [probe("127.0.0.1", probe_port) for _ in range(16)]
        assert answers == [200] * 16, answers
        assert probe("127.0.0.1", probe_port, "/readyz") in (200, 503)  # an answer, whatever it says

        # The flood was still on while the probes were answered.
        wait_until("the metrics listener still fails", lambda: probe(node_ip, metrics_port, timeout=2) == 0)
        assert flood.poll() is None
    finally:
        if flood is not None:
            flood.kill()
            flood.wait(10)
        publisher.kill()


def _exited(publisher: Publisher) -> bool:
    return publisher.proc is not None and publisher.proc.poll() is not None
