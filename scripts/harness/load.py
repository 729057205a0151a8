"""Load the machine the way a busy node is loaded while the suite runs: `scripts/test.sh --load`.

Two workers, until SIGTERM or SIGINT:
- a CPU burner: one process spinning on one core (the node's other workloads);
- an fsync loop: rewrites a 4 MiB file and fsyncs it and its directory, again and again, on the
  disk the tests write to (image pulls and container root filesystems do this when pods start).

A test that passes only on an idle machine waits on time rather than on its outcome; this mode
is how such a test is found before it costs a CI run. On exit it prints what it did, so a run's
log shows the load really ran.

    python3 scripts/harness/load.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import tempfile
import time

CHUNK = 4 << 20


def _leave_signals_to_the_parent() -> None:
    """A worker stops when the parent sets the event, so it reports its count (a group kill included)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def burn(stop: multiprocessing.Event, count: multiprocessing.Value) -> None:
    _leave_signals_to_the_parent()
    spins = 0
    while not stop.is_set():
        for _ in range(200_000):
            pass
        spins += 1
    count.value = spins


def fsync_loop(stop: multiprocessing.Event, count: multiprocessing.Value, directory: str) -> None:
    _leave_signals_to_the_parent()
    data = os.urandom(CHUNK)
    path = os.path.join(directory, "fsync-load")
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    syncs = 0
    try:
        while not stop.is_set():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.fsync(dir_fd)
            syncs += 1
    finally:
        os.close(dir_fd)
        count.value = syncs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=None, help="where the fsync loop writes (default: the temp dir)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="netclaim-load-", dir=args.dir)
    stop = multiprocessing.Event()
    spins, syncs = multiprocessing.Value("q", 0), multiprocessing.Value("q", 0)
    workers = [multiprocessing.Process(target=burn, args=(stop, spins), name="cpu-burner"),
               multiprocessing.Process(target=fsync_loop, args=(stop, syncs, work), name="fsync-loop")]
    for w in workers:
        w.start()

    asked: list[int] = []  # a signal handler must not touch the event: it may interrupt its own wait

    def finish(signum: int, _frame: object) -> None:
        asked.append(signum)

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    t0 = time.monotonic()
    print(f"[load] cpu burner pid {workers[0].pid}, fsync loop pid {workers[1].pid} in {work}",
          file=sys.stderr, flush=True)
    while not asked:
        time.sleep(0.5)
        if not all(w.is_alive() for w in workers):
            print("[load] a load worker died: the run is not under load any more", file=sys.stderr, flush=True)
            break
    stop.set()
    for w in workers:
        w.join(10)
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))
    os.rmdir(work)
    took = time.monotonic() - t0
    print(f"[load] {took:.0f} s under load: {spins.value} burner rounds, {syncs.value} fsyncs "
          f"({syncs.value / max(took, 1):.1f}/s)", file=sys.stderr, flush=True)
    return 0 if all(w.exitcode == 0 for w in workers) else 1


if __name__ == "__main__":
    sys.exit(main())
