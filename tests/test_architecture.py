"""The core's structure, computed from its source: folders are layers and imports go down them only,
and private thunder names are read only in the accessors at the bottom, ``thunderplug.thunder_compat``."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "core" / "src" / "thunderplug"
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every thunderplug module ``path`` imports, function-local imports included
    (``from thunderplug.plugin_api import hookspecs`` is an import of ``thunderplug.plugin_api.hookspecs``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("thunderplug"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("thunderplug"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in CORE.rglob("*.py")}
    return {name: {m for m in _imports(path, set(paths)) if m in paths and m != name} for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


#: The layers of the core, bottom first. A module belongs to the layer of its folder, a module at the
#: package root (the facade ``thunderplug``, ``testing``, ``recipe``, ``moved``) to the facade's, and
#: ``__main__`` (``python -m thunderplug``) to the commands, which call the facade's ``discover()``. A
#: module imports modules of its own layer or of layers below, never above (docs/architecture.md).
FACADE = "thunderplug"
LAYERS = ("thunder_compat", "plugin_api", "tracing", "caching", "eager", "subclass", "host", "wiring", FACADE,
          "commands")
#: the subclass compiler's modules, each importing only the ones before it
SUBCLASS_LAYERS = ("values", "plan", "replay", "unroll", "residuals", "autodiff", "symbols", "dispatch", "inplace",
                   "distributed", "gradient_layouts", "executor", "interception")


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if module == "thunderplug.__main__":
        return "commands"
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return FACADE if len(parts) <= 2 else None


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for each import of a module in a higher layer than the importer's."""
    rank = {layer: index for index, layer in enumerate(LAYERS)}
    return [f"{name} -> {target}" for name, targets in sorted(graph.items()) for target in sorted(targets)
            if rank[_layer(target)] > rank[_layer(name)]]


def test_every_module_is_in_a_layer():
    unplaced = [name for name in _graph() if _layer(name) is None]
    assert not unplaced, f"add their folders to LAYERS (and docs/architecture.md): {unplaced}"


def test_no_module_imports_a_higher_layer():
    assert not _upward_imports(_graph())


def test_the_layer_check_can_fail():
    graph = {"thunderplug.tracing.aten": {"thunderplug.host.claims"}, "thunderplug.host.claims": set()}
    assert _upward_imports(graph) == ["thunderplug.tracing.aten -> thunderplug.host.claims"]


def test_the_accessors_of_thunder_are_alone_at_the_bottom_and_import_nothing_of_thunderplug():
    graph = _graph()
    assert [name for name in graph if _layer(name) == "thunder_compat"] == ["thunderplug.thunder_compat"]
    assert graph["thunderplug.thunder_compat"] == set()


def test_the_core_import_graph_has_no_cycle():
    graph = {name: targets - {FACADE} for name, targets in _graph().items() if name != FACADE}
    assert "thunderplug.subclass.values" in graph  # the scan sees the package
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_subclass_layers_import_in_one_direction_only():
    graph = _graph()
    assert {name.rsplit(".", 1)[-1] for name in graph if name.startswith("thunderplug.subclass.")} == set(
        SUBCLASS_LAYERS
    )
    for index, layer in enumerate(SUBCLASS_LAYERS):
        imported = {m.rsplit(".", 1)[-1] for m in graph[f"thunderplug.subclass.{layer}"] if ".subclass." in m}
        later = imported - set(SUBCLASS_LAYERS[:index])
        assert not later, f"subclass.{layer} imports a later layer: {later}"


def test_old_module_paths_import_the_moved_modules():
    from thunderplug.moved import MOVED, RENAMED_ONLY

    for old, new in MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
    for old, new in RENAMED_ONLY.items():
        with pytest.raises(ModuleNotFoundError, match=new.replace(".", r"\.")):
            importlib.import_module(old)
    assert callable(importlib.import_module(FACADE).report)  # still the function


def test_old_module_paths_name_no_module_that_exists():
    graph = _graph()
    from thunderplug.moved import MOVED, RENAMED_ONLY

    assert not [old for old in [*MOVED, *RENAMED_ONLY] if old in graph]
    assert all(new in graph for new in [*MOVED.values(), *RENAMED_ONLY.values()])


def test_the_cycle_check_can_fail():
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def _private_thunder_reads(path: Path) -> list[str]:
    """``from thunder... import _x`` and ``<thunder module>._x`` attribute reads."""
    tree = ast.parse(path.read_text())
    thunder_names: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "thunder":
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{node.module}.{alias.name}")
                thunder_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "thunder":
                    thunder_names.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in thunder_names
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


ACCESSORS = CORE / "thunder_compat" / "__init__.py"


def test_private_thunder_names_are_read_only_in_the_accessors():
    offenders = {}
    for path in [*CORE.rglob("*.py"), *PLUGINS.rglob("src/**/*.py")]:
        if path == ACCESSORS:
            continue
        if reads := _private_thunder_reads(path):
            offenders[str(path.relative_to(CORE.parents[2]))] = reads
    assert not offenders, offenders


def test_the_private_name_check_can_fail(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from thunder.core import jit_ext\n"
        "from thunder.torch import _torch_to_thunder_function_map\n"
        "x = jit_ext._general_jit_lookaside_map\n"
    )
    assert _private_thunder_reads(sample) == [
        "thunder.torch._torch_to_thunder_function_map",
        "jit_ext._general_jit_lookaside_map",
    ]


def test_every_patch_names_its_owners_and_every_speedup_what_it_saves():
    from thunderplug.wiring.patches import PATCHES

    graph = _graph()
    for patch in PATCHES:
        assert patch.features and all(f"thunderplug.{feature}" in graph for feature in patch.features), patch.name
        if {"wiring.speedups", "wiring.sharing"} & set(patch.features):  # the patches that exist for speed
            assert patch.saves, f"{patch.name}: say what it saves, measured (or 'not measured')"


def layers_markdown() -> str:
    """The table of docs/architecture.md that says, for each layer (top first), which layers below it its
    modules import, computed from the source."""
    graph = _graph()
    lines = ["| layer | its modules import |", "|---|---|"]
    for layer in reversed(LAYERS):
        below = {_layer(target) for name, targets in graph.items() if _layer(name) == layer for target in targets}
        names = [f"`{other}`" for other in reversed(LAYERS) if other in below - {layer}]
        lines.append(f"| `{layer}` | {', '.join(names) or 'nothing of thunderplug'} |")
    return "\n".join(lines) + "\n"


def test_architecture_md_has_the_layers_and_the_patches_by_owner_as_generated():
    from thunderplug.wiring.patches import owners_markdown

    text = (CORE.parents[2] / "docs" / "architecture.md").read_text()
    assert layers_markdown() in text, "regenerate: python tests/test_architecture.py"
    assert owners_markdown() in text, "regenerate: python -m thunderplug.wiring.patches --owners"


if __name__ == "__main__":
    print(layers_markdown(), end="")
