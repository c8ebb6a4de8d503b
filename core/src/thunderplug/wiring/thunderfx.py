"""thunderfx (``torch.compile(backend=thunder.dynamo.ThunderCompiler(executors=discover()))``) with
tensor-subclass inputs.

thunder's splitter decides node by node what thunder supports by flattening each node's example
values with ``thunder.core.pytree.tree_flatten``, which knows no tensor subclass: any graph with a
subclass input fails there (``tree_flatten of type TwoTensor is not supported``), before any
executor is asked. With thunderplug's executors in the options, such a graph is instead compiled
whole by ``thunder.jit`` (the path that handles subclass inputs: guards, subclass ops, autodiff
above the subclass). Graphs without subclass inputs, and compilers without thunderplug's
executors, go through thunder's splitter unchanged. The whole graph is one thunder region, so
``ThunderCompiler.subgraph_infos`` does not list it, and an op thunder cannot trace is an error
from ``thunder.jit`` rather than a split to inductor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def compiler_class() -> type:
    """``thunder.dynamo.ThunderCompiler``.

    Importing thunder.dynamo imports ``torch.utils.cpp_extension``, which logs a warning on machines
    with a CUDA toolkit but no CUDA runtime; that says nothing about thunderplug, so it is held back.
    """
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from thunder.dynamo import ThunderCompiler
    finally:
        logger.setLevel(level)
    return ThunderCompiler


def uses_thunderplug(executors: Any) -> bool:
    from thunderplug.subclass.executor import ThunderplugExecutor

    return any(isinstance(executor, ThunderplugExecutor) for executor in executors or ())


def subclass_graphs_to_jit(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ThunderCompiler.__call__`` that compiles graphs with subclass inputs whole with ``thunder.jit``."""

    def __call__(self: Any, gm: torch.fx.GraphModule, sample_args: list[Any]) -> Any:
        if not uses_thunderplug(self.thunder_options.get("executors")) or not any(
            is_traceable_wrapper_subclass(arg) for arg in sample_args
        ):
            return original(self, gm, sample_args)
        return jit_graph(gm, self.thunder_options)

    return __call__


def jit_graph(gm: torch.fx.GraphModule, options: dict[str, Any]) -> Any:
    """A Dynamo graph compiled whole by ``thunder.jit`` with ``options``."""
    import thunder
    from thunder.dynamo.utils import recompile_graph, remove_empty_autocast

    remove_empty_autocast(gm)
    recompile_graph(gm)  # Dynamo generates the GraphModule's code lazily
    return thunder.jit(gm, **options)
