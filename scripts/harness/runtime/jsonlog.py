"""One JSON object per line on stderr: what the harness did, with ids.

The harness runs inside pytest, the demo and the benchmarks; a single line
per event with the pod, sandbox and path it concerns is what makes a failed
run explainable afterwards (pytest shows captured stderr of a failing test).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def log(event: str, **fields: Any) -> None:
    record = {"ts": round(time.time(), 3), "component": "runtime-harness", "event": event}
    record.update({k: v for k, v in fields.items() if v is not None})
    print(json.dumps(record, default=str, separators=(",", ":")), file=sys.stderr, flush=True)
