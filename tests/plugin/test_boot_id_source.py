"""Which boot an event's stamp names: the kernel's boot id, or a simulated reboot's file.

A test cannot reboot its host, so a simulated reboot names a file of its own in
NETCLAIM_BOOT_ID_FILE, in the runtime's environment (every plugin run inherits
it) and the publisher's. Until that file exists the kernel's boot id is used, so
setting the variable ahead of the simulated reboot changes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KERNEL = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
STAMP = "from cni_plugin.wire import event; print(event.new_order()[0])"


def stamped_boot(env_file: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NETCLAIM_BOOT_ID_FILE"}
    if env_file is not None:
        env["NETCLAIM_BOOT_ID_FILE"] = env_file
    return subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); {STAMP}"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_an_event_is_stamped_with_the_kernels_boot_id_by_default() -> None:
    assert stamped_boot(None) == KERNEL


def test_a_simulated_reboots_boot_id_file_names_the_boot(tmp_path: Path) -> None:
    simulated = str(uuid.uuid4())
    (tmp_path / "boot_id").write_text(simulated + "\n")
    assert stamped_boot(str(tmp_path / "boot_id")) == simulated != KERNEL


def test_a_simulated_boot_not_begun_yet_keeps_the_kernels_boot_id(tmp_path: Path) -> None:
    assert stamped_boot(str(tmp_path / "absent")) == KERNEL
