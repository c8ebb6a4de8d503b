"""Real programs nobody here wrote (torchao, torch.testing._internal, upstream thunder's subclass
tests), each run under eager, stock ``thunder.jit``, ``torch.compile(backend="aot_eager")`` and
``thunder.jit(executors=thunderplug.discover())``; eager is the specification."""

from __future__ import annotations

import importlib

#: the case modules, each with a ``CASES`` list
MODULES = ("torchao_quantize", "torch_subclasses", "issue_repros", "upstream_thunder", "torchao_training")


def all_cases() -> list:
    return [c for module in MODULES for c in importlib.import_module(f"real_programs.{module}").CASES]
