"""One measured cell of a benchmark in a fresh Python process.

Why: compiled graphs, thunder's caches, inductor's on-disk cache and the allocator's state of one cell must not
reach the next, or first-call and memory figures measure the order of the cells. Each worker prints its result as
one JSON line on stdout; anything else it prints is ignored.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import tempfile


@dataclasses.dataclass
class Outcome:
    printed: list[dict]  # the JSON lines the worker printed, in order
    error: str | None  # None when the worker exited 0 having printed a result
    stderr: str

    def result(self, **context) -> dict:
        """The worker's last printed result, or ``{**context, "error": ...}``."""
        return self.printed[-1] if self.error is None else {**context, "error": self.error}


def last_error_line(text: str) -> str:
    """The last line of ``text`` that names an exception, else its last line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if line.split(":", 1)[0].endswith(("Error", "Exception", "Interrupt", "Exit")):
            return line
    return lines[-1] if lines else "(no output)"


def run(cmd: list[str], timeout: float, cache_prefix: str, env: dict[str, str] | None = None) -> Outcome:
    """``cmd`` with an empty inductor cache of its own, warnings and thunderplug's notices off."""
    with tempfile.TemporaryDirectory(prefix=f"{cache_prefix}-inductor-") as cache:
        full_env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, PYTHONWARNINGS="ignore", THUNDERPLUG_QUIET="1",
                        **(env or {}))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                                  cwd=pathlib.Path(__file__).resolve().parent)
        except subprocess.TimeoutExpired:
            return Outcome([], f"timeout after {timeout:.0f} s", "")
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and printed:
        return Outcome(printed, None, proc.stderr)
    if proc.returncode < 0:
        try:
            error = f"crash ({signal.Signals(-proc.returncode).name})"
        except ValueError:
            error = f"crash (signal {-proc.returncode})"
    else:
        error = f"FAIL (rc {proc.returncode}) `{last_error_line(proc.stderr)[:200]}`"
    return Outcome(printed, error, proc.stderr)
