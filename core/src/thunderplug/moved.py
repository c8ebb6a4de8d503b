"""The module paths thunderplug had before its modules were grouped into folders by role (issue 37),
kept importable for plugins and users: ``import thunderplug.settings`` gives the very module
``thunderplug.plugin_api.settings`` (one module object under two names, so an attribute set or
monkeypatched through either name is seen through both).

Resolved only when an old path is imported, so ``import thunderplug`` stays as light as before.
``thunderplug.report`` is the facade's function, not a module, and stays so: importing it as a
module fails with a message naming the module's new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

#: old path -> the module it is now
MOVED: dict[str, str] = {
    **{f"thunderplug.{name}": f"thunderplug.plugin_api.{name}"
       for name in ("specs", "hookspecs", "settings", "notices", "availability", "version")},
    **{f"thunderplug.{name}": f"thunderplug.tracing.{name}" for name in ("fake", "trace_state", "compilation", "aten")},
    **{f"thunderplug.{name}": f"thunderplug.caching.{name}" for name in ("reuse", "regions", "recompiles")},
    **{f"thunderplug.{name}": f"thunderplug.eager.{name}"
       for name in ("output_grads", "inplace_grads", "broadcast_grads", "compile_branches", "functorch_transforms")},
    "thunderplug.distributed": "thunderplug.subclass.distributed",
    **{f"thunderplug.{name}": f"thunderplug.host.{name}" for name in ("discovery", "claims", "builtins", "executors")},
    **{f"thunderplug.{name}": f"thunderplug.commands.{name}" for name in ("cli", "demo", "explain")},
    **{f"thunderplug.thunder_compat.{name}": f"thunderplug.wiring.{name}"
       for name in ("patches", "fixes", "speedups", "sharing")},
    "thunderplug.thunderfx": "thunderplug.wiring.thunderfx",
}

#: old paths that cannot be aliases (the name is taken in the facade) -> the module's new path
RENAMED_ONLY: dict[str, str] = {"thunderplug.report": "thunderplug.plugin_api.report"}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds each old path of :data:`MOVED` and loads it as the module at its new path."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in RENAMED_ONLY:
            raise ModuleNotFoundError(
                f"{fullname} is now {RENAMED_ONLY[fullname]} (thunderplug.report() is the report function)",
                name=fullname,
            )
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at the new path has run already."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
