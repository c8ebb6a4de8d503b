"""The ATen overloads this plugin defines: importing the category modules fills ``ALL_OPS``."""

from __future__ import annotations

from thunderplug_aten_ops import creation, elementwise, linalg, metadata, nn, reductions, shape  # noqa: F401
from thunderplug_aten_ops._registry import ALL_OPS

__all__ = ["ALL_OPS"]
