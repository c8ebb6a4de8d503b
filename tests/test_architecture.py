"""The core's structure, computed from its source: imports go one way, and private thunder names
are read only in ``thunderplug.thunder_compat``."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core" / "src" / "thunderplug"
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every thunderplug module ``path`` imports, function-local imports included
    (``from thunderplug import hookspecs`` is an import of ``thunderplug.hookspecs``)."""
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


#: The package root is the public facade (``discover``, ``__version__``): the user-facing
#: commands (cli, demo, recipe) call it, so it is left out of the cycle check, and the layers
#: below the host never import it at all.
FACADE = "thunderplug"
BELOW_THE_HOST = ("thunderplug.subclass", "thunderplug.thunder_compat", "thunderplug.aten", "thunderplug.fake",
                  "thunderplug.compilation", "thunderplug.specs", "thunderplug.claims", "thunderplug.broadcast_grads")


def test_the_core_import_graph_has_no_cycle():
    graph = {name: targets - {FACADE} for name, targets in _graph().items() if name != FACADE}
    assert "thunderplug.subclass.values" in graph  # the scan sees the package
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_layers_below_the_host_never_import_the_facade():
    graph = _graph()
    offenders = [name for name in graph if name.startswith(BELOW_THE_HOST) and FACADE in graph[name]]
    assert not offenders


def test_the_subclass_layers_import_in_one_direction_only():
    layers = ["values", "plan", "replay", "unroll", "residuals", "autodiff", "symbols", "dispatch", "inplace",
              "gradient_layouts", "executor", "interception"]
    graph = _graph()
    for index, layer in enumerate(layers):
        imported = {m.rsplit(".", 1)[-1] for m in graph[f"thunderplug.subclass.{layer}"] if ".subclass." in m}
        later = imported - set(layers[:index])
        assert not later, f"subclass.{layer} imports a later layer: {later}"


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


def test_private_thunder_names_are_read_only_in_thunder_compat():
    offenders = {}
    for path in [*CORE.rglob("*.py"), *PLUGINS.rglob("src/**/*.py")]:
        if "thunder_compat" in path.parts:
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
