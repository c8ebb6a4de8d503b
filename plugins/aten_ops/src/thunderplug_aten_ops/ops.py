"""Every ATen overload this plugin defines, collected explicitly (importing a module registers nothing)."""

from __future__ import annotations

import functools

from thunderplug import AtenOp
from thunderplug_aten_ops import creation, elementwise, forwards, linalg, metadata, nn, reductions, shape

__all__ = ["NOT_REGISTERED", "aten_ops"]

#: core overloads this plugin leaves out on purpose, with why (docs/aten_coverage.md lists them)
NOT_REGISTERED = {
    "nonzero.default": "data-dependent output shape: thunder 0.2.6 traces have static shapes, so it is no trace "
    "symbol; under discover() a function calling it runs with a graph break there, the op eager (the core's "
    "wiring.graph_breaks)",
}


@functools.cache
def aten_ops() -> tuple[AtenOp, ...]:
    """The plugin's AtenOps: the plain forwards table, then each category module's."""
    return (
        *forwards.ops(),
        *creation.ops(),
        *elementwise.ops(),
        *linalg.ops(),
        *metadata.ops(),
        *nn.ops(),
        *reductions.ops(),
        *shape.ops(),
    )
