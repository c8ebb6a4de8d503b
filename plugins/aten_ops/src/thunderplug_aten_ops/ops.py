"""The ATen overloads this plugin defines: importing the category modules fills ``ALL_OPS``."""

from __future__ import annotations

from thunderplug_aten_ops import creation, elementwise, linalg, metadata, nn, reductions, shape  # noqa: F401
from thunderplug_aten_ops._registry import ALL_OPS

__all__ = ["ALL_OPS", "NOT_REGISTERED"]

#: core overloads this plugin leaves out on purpose, with why (docs/aten_coverage.md lists them)
NOT_REGISTERED = {
    "nonzero.default": "data-dependent output shape: thunder proxies and torch's FakeTensor meta need static shapes",
}
