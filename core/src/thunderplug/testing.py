"""pytest plugin for thunderplug plugin authors.

Enable it with ``pytest_plugins = ["thunderplug.testing"]`` (or ``-p thunderplug.testing``). It gives:

* ``plugin_host``: a fresh :class:`~thunderplug.PluginHost` that loads no entry points (thunderplug's
  own default plugins only);
* ``register_plugin(obj, name)``: adds a plugin to the shared host that ``thunderplug.discover()``
  uses, for one test only;
* the ``requires_cuda`` marker, which skips with the same reason ``thunderplug plugins`` shows;
* a ``thunderplug plugins: ...`` line in pytest's header (what was active for this run);
* :class:`PluginContract`: subclass it in a plugin's tests (``class TestMine(PluginContract):
  plugin_name = "mine"``) for the checks every plugin must pass.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from thunderplug.host.discovery import PluginHost, default_host
from thunderplug.plugin_api import settings
from thunderplug.plugin_api.availability import cuda_unavailable_reason
from thunderplug.plugin_api.report import PluginStatus, Status


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_cuda: needs a CUDA device; skipped with the reason otherwise")


def pytest_report_header(config: pytest.Config) -> str:
    """``thunderplug plugins: aten_ops-0.1.0, nvfuser (unavailable), ...``, like pytest's ``plugins:`` line."""
    entries = [
        f"{s.name}-{s.version}" if s.status is Status.ACTIVE else f"{s.name} ({s.status.value})"
        for s in default_host().report()
        if not s.builtin
    ]
    return "thunderplug plugins: " + (", ".join(entries) or "none")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("requires_cuda"):
        reason = cuda_unavailable_reason()
        if reason:
            pytest.skip(reason)


@pytest.fixture
def plugin_host(monkeypatch: pytest.MonkeyPatch) -> PluginHost:
    """A host with no plugins loaded from entry points and no THUNDERPLUG_* variables applied."""
    for variable in (settings.PLUGINS, settings.DISABLE, settings.STRICT, settings.QUIET):
        monkeypatch.delenv(variable, raising=False)
    return PluginHost(load_entry_points=False)


@pytest.fixture
def register_plugin() -> Iterator[Callable[[object, str], PluginStatus]]:
    """Register plugin objects with the shared host for the duration of one test."""
    host = default_host()
    added: list[str] = []

    def register(plugin: object, name: str) -> PluginStatus:
        added.append(name)
        return host.add_plugin(plugin, name)

    yield register
    for name in added:
        host.remove_plugin(name)


class PluginContract:
    """What every installed plugin must satisfy, as tests: subclass and set ``plugin_name`` (its
    entry-point name) and, for a plugin that imports a heavy package only when available,
    ``heavy_modules`` (modules that loading it, asking its availability and calling its register
    hooks must not import: only executor factories may)."""

    plugin_name: str = ""
    heavy_modules: tuple[str, ...] = ()

    def _status(self) -> PluginStatus:
        found = {s.name: s for s in PluginHost(environ={}).report()}
        assert self.plugin_name in found, f"no plugin {self.plugin_name!r}; installed: {sorted(found)}"
        return found[self.plugin_name]

    def test_entry_point_is_installed(self) -> None:
        names = [ep.name for ep in importlib.metadata.entry_points(group="thunderplug")]
        assert names.count(self.plugin_name) == 1, names

    def test_is_active_or_says_why_not(self) -> None:
        status = self._status()
        assert status.status in (Status.ACTIVE, Status.UNAVAILABLE), (status.status, status.reason)
        if status.status is Status.UNAVAILABLE:
            assert status.reason
        for executor, reason in status.unavailable_executors.items():
            assert reason, f"executor {executor!r} is unavailable without a reason"

    def test_registers_something_when_active(self) -> None:
        status = self._status()
        if status.status is Status.ACTIVE:
            assert status.executors or status.aten_ops, "an active plugin that registers nothing"

    def test_loading_imports_no_heavy_module(self) -> None:
        if not self.heavy_modules:
            return
        probe = (
            "import json, sys\n"
            "from thunderplug.host.discovery import PluginHost\n"
            "PluginHost(environ={}).report()\n"
            f"print(json.dumps([m for m in {list(self.heavy_modules)!r} if m in sys.modules]))\n"
        )
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.splitlines()[-1]) == [], "imported while loading and registering"
