"""Install throwaway plugin distributions into a temporary folder on ``sys.path``.

Each one is a real distribution as far as ``importlib.metadata`` is concerned (a ``.dist-info``
with an ``entry_points.txt``), so discovery goes through the same code path as ``pip install``.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest


class FakeDistributions:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch):
        self.root = root
        self._monkeypatch = monkeypatch
        monkeypatch.syspath_prepend(str(root))

    def add(self, plugin_name: str, module_source: str, *, module: str | None = None, version: str = "1.0") -> str:
        """Write ``module_source`` as a module and a distribution whose entry point names it."""
        module = module or f"fake_plugin_{plugin_name}"
        dist = f"fake-{plugin_name.replace('_', '-')}"
        (self.root / f"{module}.py").write_text(textwrap.dedent(module_source))
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[thunderplug]\n{plugin_name} = {module}\n")
        self._monkeypatch.delitem(sys.modules, module, raising=False)
        return dist
