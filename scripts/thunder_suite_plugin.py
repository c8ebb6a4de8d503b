"""pytest plugin for ``scripts/thunder_suite.py``: runs thunder's shipped tests in one of three modes and
records each test's outcome as it ends.

Loaded with ``-p thunder_suite_plugin`` (``scripts/`` on ``PYTHONPATH``); configured by environment:

* ``THUNDER_SUITE_MODE``: ``stock`` (thunder as shipped), ``patches`` (``discover()`` called once, so its
  patches are installed and its executors built, but ``thunder.jit`` left as it is: what plain
  ``thunder.jit`` does in a process that also uses thunderplug), or
  ``discover`` (``thunder.jit`` given thunderplug's executors: ``executors=None`` becomes ``discover()``,
  an explicit list ``L`` becomes ``discover(include_defaults=False) + L``; ``thunder.compile``,
  ``ThunderCompiler`` and the tests' ``make_callable`` all call ``thunder.jit`` and so get them too).
* ``THUNDER_SUITE_RECORD``: a JSON-lines file; each test adds ``{"start": id}`` when it starts and
  ``{"id", "outcome", "message", "seconds", "cpu"}`` when it ends (wall and user+sys CPU seconds), flushed
  at once, so a test that kills the process is known by its ``start`` alone.
* ``THUNDER_SUITE_COLLECTED``: optional file the collected test ids are written to (one a line).
* ``THUNDER_SUITE_SELECT``: optional file of test ids (one a line) to run; the others are deselected.
* ``THUNDER_SUITE_DONE``: optional file of test ids to deselect: a rerun after a crash.
* ``THUNDER_SUITE_TIMEOUT``: seconds one test may take (setup, call, teardown) before the process is
  ended with the stack of every thread printed (``faulthandler``): a hang is recorded like a crash.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import resource
import time
from typing import Any

import pytest

_MODE = os.environ.get("THUNDER_SUITE_MODE", "stock")
_record_file: Any = None
_reports: dict[str, list[Any]] = {}


def pytest_configure(config: pytest.Config) -> None:
    global _record_file
    path = os.environ.get("THUNDER_SUITE_RECORD")
    if path:
        _record_file = open(path, "a", buffering=1)  # kept open for the whole session
    if _MODE in ("patches", "discover"):
        import thunderplug

        thunderplug.discover(quiet=True)
    if _MODE == "discover":
        _inject_discover()
    elif _MODE != "patches" and _MODE != "stock":
        raise pytest.UsageError(f"THUNDER_SUITE_MODE must be stock, patches or discover, not {_MODE!r}")


def _inject_discover() -> None:
    """``thunder.jit`` (the name every entry point looks up when it is called) given thunderplug's executors."""
    import thunder

    import thunderplug
    from thunderplug.wiring.thunderfx import uses_thunderplug

    original = thunder.jit

    @functools.wraps(original)
    def jit(fn: Any, /, *args: Any, executors: Any = None, **kwargs: Any) -> Any:
        if executors is None:
            executors = thunderplug.discover(quiet=True)
        elif isinstance(executors, (list, tuple)) and not uses_thunderplug(executors):
            executors = [*thunderplug.discover(include_defaults=False, quiet=True), *executors]
        return original(fn, *args, executors=executors, **kwargs)

    thunder.jit = jit


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    collected = os.environ.get("THUNDER_SUITE_COLLECTED")
    if collected:
        with open(collected, "w") as f:
            f.writelines(item.nodeid + "\n" for item in items)
    select, done = _ids("THUNDER_SUITE_SELECT"), _ids("THUNDER_SUITE_DONE") or set()
    kept = [item for item in items if (select is None or item.nodeid in select) and item.nodeid not in done]
    if len(kept) != len(items):
        kept_ids = {id(item) for item in kept}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept_ids])
        items[:] = kept


def _ids(variable: str) -> set[str] | None:
    path = os.environ.get(variable)
    if not path:
        return None
    with open(path) as f:
        return {line.rstrip("\n") for line in f if line.strip()}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _write({"start": item.nodeid})
    started, cpu_started = time.monotonic(), _cpu_seconds()
    timeout = float(os.environ.get("THUNDER_SUITE_TIMEOUT", "0") or 0)
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        yield
    finally:
        if timeout > 0:
            faulthandler.cancel_dump_traceback_later()
    reports = _reports.pop(item.nodeid, [])
    outcome, message = _outcome(reports)
    _write({
        "id": item.nodeid, "outcome": outcome, "message": message, "seconds": time.monotonic() - started,
        "cpu": _cpu_seconds() - cpu_started,
    })  # fmt: skip


def _cpu_seconds() -> float:
    """User and system CPU time of this process (every thread) and of its finished children: what a test
    costs whatever else the machine runs, where wall time grows with the other processes' load."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _reports.setdefault(report.nodeid, []).append(report)


def _outcome(reports: list[pytest.TestReport]) -> tuple[str, str]:
    """One of passed, failed, error (setup or teardown failed), skipped, xfailed, xpassed, xpassed-strict (a
    strict xfail that passed, which pytest reports as failed); and the first line of what failed."""
    for report in reports:
        if report.failed and report.when == "call" and str(report.longrepr).startswith("[XPASS(strict)]"):
            return "xpassed-strict", str(report.longrepr)[:200]
        if report.failed:
            kind = "failed" if report.when == "call" else "error"
            return kind, _first_line(report)
    for report in reports:
        if hasattr(report, "wasxfail"):
            return ("xfailed" if report.skipped else "xpassed"), str(report.wasxfail)[:200]
    for report in reports:
        if report.skipped:
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            return "skipped", str(reason)[:200]
    return ("passed", "") if reports else ("error", "no report")


def _first_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip().splitlines()[0][:300] if text.strip() else ""


def _write(record: dict) -> None:
    if _record_file is not None:
        _record_file.write(json.dumps(record) + "\n")
