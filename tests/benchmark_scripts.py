"""benchmarks/*.py loaded by path for the tests (benchmarks/ is no package), one module object per file."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> types.ModuleType:
    """``benchmarks/<name>.py``, imported once under the name ``benchmark_<name>``."""
    key = f"benchmark_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]
