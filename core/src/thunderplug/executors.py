"""Turning what plugins registered into the executor list ``thunder.jit`` takes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import thunder
from thunder.extend import Executor, OperatorExecutor

from thunderplug import aten, broadcast_grads
from thunderplug.discovery import PluginHost
from thunderplug.specs import AtenOp

CORE_EXECUTOR_NAME = "thunderplug"

_built: dict[Callable[[], Any], Executor] = {}
_core_executors: dict[tuple, OperatorExecutor] = {}


def core_executor(aten_ops: list[AtenOp]) -> OperatorExecutor:
    """The interpretation-time executor: routes ``torch.ops.aten`` calls to thunderplug symbols.

    It executes nothing itself; thunder only consults its lookasides while tracing. Listed first,
    it never competes with the plugins' executors for claims.
    """
    key = tuple((op.overload, op.decomposition) for op in aten_ops)
    if key not in _core_executors:
        executor = OperatorExecutor(CORE_EXECUTOR_NAME, version=_version())
        executor._lookasides.update(aten.lookasides(aten_ops))
        _core_executors[key] = executor
    return _core_executors[key]


def _version() -> str:
    import thunderplug

    return thunderplug.__version__


def assemble_executors(
    host: PluginHost, *, only: Iterable[str] | None, exclude: Iterable[str], include_defaults: bool
) -> list[Executor]:
    """Core executor, the broadcast-grads executor, every selected plugin executor by priority, then
    thunder's defaults.

    A factory that raises marks its plugin ``failed`` (or re-raises under THUNDERPLUG_STRICT) and
    the rest of the list is still returned.
    """
    exclude = tuple(exclude)
    executors: list[Executor] = [core_executor(host.aten_ops())]
    if broadcast_grads.EXECUTOR_NAME not in exclude:  # grad rules for implicitly broadcast 0-dim tensors
        executors.append(broadcast_grads.executor())
    for spec in host.executor_specs(only=only, exclude=exclude):
        try:
            if spec.factory not in _built:
                _built[spec.factory] = spec.factory()
            executors.append(_built[spec.factory])
        except Exception as error:  # noqa: BLE001 - one broken executor must not take down the others
            if host.strict:
                raise
            host.mark_failed(host.provider_of(spec.name) or spec.name, error)
    if include_defaults:
        names = {executor.name for executor in executors}
        executors += [ex for ex in thunder.get_default_executors() if ex.name not in names]
    return executors
