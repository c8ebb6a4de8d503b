"""thunder's own entry points for thunderplug: a recipe and a plugin, registered by ``import thunderplug``.

* ``thunder.compile(model, recipe="thunderplug")``: ``thunder.jit(model, executors=discover())``
  through thunder's recipe machinery (so thunder plugins such as ``"ddp"`` combine with it:
  ``thunder.compile(model, recipe="thunderplug", plugins="ddp")``).
* ``thunder.compile(model, plugins="thunderplug")``: add thunderplug's executors to another recipe
  (thunder's default one included). Executors of ``PRE`` plugins come before the recipe's own,
  so the recipe's fuser still fuses what thunderplug unrolls.

Registration goes through thunder's public registries (``thunder.recipes.register_recipe``,
``thunder.plugins.register_plugin``).
"""

from __future__ import annotations

import warnings
from typing import Any

with warnings.catch_warnings():
    # thunder 0.2.6 warns on import wherever Transformer Engine is not installed (almost everywhere);
    # the transformer_engine plugin reports that instead, once, with the reason.
    warnings.filterwarnings("ignore", message="transformer_engine module not found!")
    import thunder.plugins
    import thunder.recipes
    from thunder import Plugin, Recipe

NAME = "thunderplug"


class ThunderplugRecipe(Recipe):
    """``executors=thunderplug.discover()`` (thunder's default executors included), nothing else.

    Unlike thunder's default recipe it adds no prologue-pruning transform: the prologue is where
    tensor-subclass inputs are checked (type, flatten context, inner tensors).
    """

    def __init__(
        self, plugins: Any = None, interpreter: Any = "thunder.jit"
    ):  # "thunder.jit"/"thunder.fx", as thunder's
        super().__init__(plugins=plugins, interpreter=interpreter)

    def setup_executors(self) -> list[Any]:
        import thunderplug

        return thunderplug.discover()


class ThunderplugPlugin(Plugin):
    """thunderplug's executors (without thunder's defaults, which the recipe chooses) for any recipe.

    They include the fuser for this machine, so a recipe holding this plugin leaves out an nvFuser that is
    not installed instead of failing (the patch "default recipe without a missing nvFuser").
    """

    replaces_missing_fusers = True

    def setup_executors(self) -> list[Any]:
        import thunderplug

        return thunderplug.discover(include_defaults=False)


def register() -> None:
    """Make ``"thunderplug"`` a recipe and a plugin name for ``thunder.compile``."""
    thunder.recipes.register_recipe(NAME, ThunderplugRecipe)
    thunder.plugins.register_plugin(NAME, ThunderplugPlugin)
