"""Every code block of README.md and docs/ runs, and what the docs quote of specs.py is what specs.py says.

* ``python`` blocks are executed, each in a fresh namespace holding ``torch``, ``thunder``,
  ``thunderplug`` and ``model`` (a small module: the README's first snippet takes one as given).
  A statement followed by a comment ``# SomeError: message`` (on its line or the next) must raise
  that error with that message. A block that defines hooks is then registered as a plugin and
  must come out ``active``; ``my_package`` (the hook examples' own code) is a stand-in module.
  A block marked ``<!-- doc-test: syntax only, REASON -->`` is compiled, not run (it needs GPUs).
* ``toml`` blocks parse, and name the entry-point group discovery reads.
* ``bash`` blocks name scripts that exist and ``thunderplug`` commands the CLI accepts (the
  one-plugin install block runs in tests/test_readme_install.py).
* The constructor signatures the docs quote (``SubclassOpClaim(executor, target, ...)``) list real
  fields in their order, and the defaults they state are the dataclasses' defaults.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
import sys
import tomllib
import types
from pathlib import Path

import pytest
import thunder
import torch

import thunderplug
from thunderplug import PluginHost, Status
from thunderplug.commands.cli import build_parser
from thunderplug.host.discovery import ENTRY_POINT_GROUP
from thunderplug.plugin_api import specs

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- doc-test: (?P<marker>[^>]*) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```", re.DOTALL)
EXPECTED_ERROR = re.compile(r"#\s*(?P<error>\w+(?:Error|Exception)): (?P<message>.*?)\s*$")


def blocks(language: str) -> list:
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in BLOCK.finditer(text):
            if match.group("lang") == language:
                line = text[: match.start("code")].count("\n") + 1
                found.append(pytest.param(match.group("code"), match.group("marker"), id=f"{document.name}:{line}"))
    return found


def _stand_in_my_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the hook examples import from the plugin's own package."""
    from thunder.extend import OperatorExecutor

    package = types.ModuleType("my_package")
    package.__path__ = []  # a package, so that ``from my_package.executor import ...`` works
    package.executor = types.ModuleType("my_package.executor")
    package.executor.build_executor = lambda: OperatorExecutor("my_executor")
    package.rules = types.ModuleType("my_package.rules")
    package.rules.checker = lambda *args: None
    package.rules.forward = torch.mm
    package.rules.backward = lambda a, b, grad: (grad @ b.t(), a.t() @ grad)
    for module in (package, package.executor, package.rules):
        monkeypatch.setitem(sys.modules, module.__name__, module)


def _run_statements(code: str, namespace: dict) -> None:
    lines = code.splitlines()
    for statement in ast.parse(code).body:
        source = ast.get_source_segment(code, statement)
        following = [lines[statement.end_lineno - 1]]
        if statement.end_lineno < len(lines) and lines[statement.end_lineno].lstrip().startswith("#"):
            following.append(lines[statement.end_lineno])
        expected = next((m for m in map(EXPECTED_ERROR.search, following) if m), None)
        compiled = compile(ast.Module([statement], type_ignores=[]), "<doc block>", "exec")
        if expected is None:
            exec(compiled, namespace)
            continue
        with pytest.raises(Exception) as raised:  # noqa: B017, PT011 - the type is checked by name below
            exec(compiled, namespace)
        assert type(raised.value).__name__ == expected.group("error"), f"{source}: {raised.value!r}"
        assert str(raised.value).startswith(expected.group("message").rstrip(".")[:60]), f"{source}: {raised.value}"


@pytest.mark.parametrize(("code", "marker"), blocks("python"))
def test_python_block_runs(code, marker, monkeypatch):
    if marker and marker.startswith("syntax only"):
        compile(code, "<doc block>", "exec")
        return
    _stand_in_my_package(monkeypatch)
    namespace = {"torch": torch, "thunder": thunder, "thunderplug": thunderplug, "model": torch.nn.Linear(4, 4)}
    namespace["__name__"] = "doc_block"
    _run_statements(code, namespace)
    hooks = {name: value for name, value in namespace.items() if hasattr(value, "thunderplug_impl")}
    if hooks:
        plugin = types.ModuleType("doc_block_plugin")
        plugin.__dict__.update(hooks)
        status = PluginHost(load_entry_points=False, environ={}).add_plugin(plugin, "doc_block_plugin")
        if "cuda_unavailable_reason" in code and not torch.cuda.is_available():  # the CUDA-only examples
            assert status.status is Status.UNAVAILABLE and "no CUDA device" in status.reason, status.reason
        else:
            assert status.status is Status.ACTIVE, status.reason
        assert status.hooks == sorted(hooks)


@pytest.mark.parametrize(("code", "marker"), blocks("toml"))
def test_toml_block_parses_and_names_the_entry_point_group(code, marker):
    entry_points = tomllib.loads(code)["project"]["entry-points"]
    assert list(entry_points) == [ENTRY_POINT_GROUP]


@pytest.mark.parametrize(("code", "marker"), blocks("bash"))
def test_bash_block_names_real_scripts_and_commands(code, marker):
    for line in code.splitlines():
        for command in line.split("&&"):
            words = shlex.split(command)
            for word in words:
                if word.startswith("scripts/"):
                    assert (ROOT / word).exists(), f"{word} does not exist"
            if words and Path(words[0]).name == "thunderplug":
                build_parser().parse_args(words[1:])  # exits (fails the test) on an unknown command


QUOTED_SIGNATURE = re.compile(r"`(?:register\()?(?P<cls>[A-Z]\w+)\((?P<args>[^()`]*)\)")


def test_quoted_signatures_list_real_fields_in_order():
    records = {cls.__name__: cls for cls in (*specs.CLAIM_TYPES, specs.ExecutorSpec, specs.AtenOp)}
    checked = set()
    for document in DOCUMENTS:
        text = re.sub(r"\s*\n\s*", " ", document.read_text())
        for match in QUOTED_SIGNATURE.finditer(text):
            cls = records.get(match.group("cls"))
            if cls is None or '"' in match.group("args"):  # a call with values, not a signature
                continue
            fields = [f.name for f in dataclasses.fields(cls)]
            quoted = [arg.split("=")[0].strip() for arg in match.group("args").split(",")]
            assert quoted == fields[: len(quoted)], f"{document.name}: {match.group(0)} but {cls.__name__} has {fields}"
            defaults = {arg.split("=")[0].strip(): arg.split("=")[1].strip() for arg in match.group("args").split(",")
                        if "=" in arg}
            for name, value in defaults.items():
                field = next(f for f in dataclasses.fields(cls) if f.name == name)
                assert repr(field.default) == value, f"{document.name}: {name}={value}, default {field.default!r}"
            checked.add(cls.__name__)
    assert checked >= {"SubclassOpClaim", "FunctionClaim", "AtenKernelClaim", "FusionFilter", "ExecutorSpec", "AtenOp"}


def test_stated_priority_defaults_are_the_defaults():
    hooks = re.sub(r"\s+", " ", (ROOT / "docs" / "hooks.md").read_text())
    claims_default = re.search(r"by `priority` \(default `Priority\.(\w+)`\)", hooks).group(1)
    for cls in (specs.SubclassOpClaim, specs.FunctionClaim, specs.AtenKernelClaim):
        assert cls.__dataclass_fields__["priority"].default == getattr(specs.Priority, claims_default), cls.__name__
    spec_default = re.search(r"\(`priority` defaults to `Priority\.(\w+)`", hooks).group(1)
    assert specs.ExecutorSpec.__dataclass_fields__["priority"].default == getattr(specs.Priority, spec_default)
    claims = re.sub(r"\s+", " ", (ROOT / "docs" / "claims.md").read_text())
    assert "(default priority `Priority.BEFORE_AUTODIFF`" in claims
    assert specs.AtenKernelClaim.__dataclass_fields__["priority"].default == specs.Priority.BEFORE_AUTODIFF


def test_quoted_backward_signature_is_the_one_claims_are_called_with():
    """claims.py calls ``backward(*args, *cotangents)``; every doc that shows the signature says so."""
    assert "backward(*args, *cotangents)" in specs.SubclassOpClaim.__doc__
    for document in DOCUMENTS:
        for quoted in re.findall(r"`backward\(([^`]*)\)`", document.read_text()):
            assert quoted == "*args, *cotangents", f"{document.name}: backward({quoted})"
