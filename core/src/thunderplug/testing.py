"""pytest plugin for thunderplug plugin authors.

Enable it with ``pytest_plugins = ["thunderplug.testing"]`` (or ``-p thunderplug.testing``). It gives:

* ``plugin_host``: a fresh :class:`~thunderplug.PluginHost` that loads no entry points (thunderplug's
  own default plugins only);
* ``register_plugin(obj, name)``: adds a plugin to the shared host that ``thunderplug.discover()``
  uses, for one test only;
* the ``requires_cuda`` marker, which skips with the same reason ``thunderplug plugins`` shows;
* a ``thunderplug plugins: ...`` line in pytest's header (what was active for this run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from thunderplug import settings
from thunderplug.availability import cuda_unavailable_reason
from thunderplug.discovery import PluginHost, default_host
from thunderplug.report import PluginStatus, Status


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
