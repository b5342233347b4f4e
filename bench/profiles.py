"""py-spy profiles of the web processes while a bench path runs, and a summary of them.

``record(pid, seconds, out)`` samples a process group (``--subprocesses``, non-blocking,
so the sampled workers are not paused) into py-spy's raw format: one collapsed stack a
line with its sample count. ``summary(path)`` folds those into the share of samples
under each frame, for the frames of the relay and the libraries it calls.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter or on PATH, or None."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def record(pid: int, seconds: float, out: Path, rate: int = 250) -> subprocess.Popen:
    """Start sampling ``pid`` and its children for ``seconds``; return the py-spy process."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not installed (pip install -e '.[test]')")
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--format", "raw"]
        + ["--rate", str(rate), "--duration", str(int(seconds)), "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def summary(path: Path, top: int = 25) -> list[tuple[str, float]]:
    """The ``top`` frames by inclusive share of the request-handling samples, in percent."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or "handle_request" not in stack:
            continue  # idle greenlet hubs and the arbiter are not request work
        n = int(count)
        total += n
        seen = set()
        for frame in stack.split(";"):
            m = _FRAME.match(frame)
            name = f"{m['func']} ({m['file']})" if m else frame
            if name not in seen:
                seen.add(name)
                inclusive[name] += n
    if not total:
        return []
    return [(name, 100 * n / total) for name, n in inclusive.most_common(top)]
