"""Turning what plugins registered into the executor list ``thunder.jit`` takes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import thunder
from thunder.extend import Executor

from thunderplug import broadcast_grads, patches
from thunderplug.claims import restrict_fusers
from thunderplug.core_executor import ThunderplugExecutor
from thunderplug.discovery import PluginHost
from thunderplug.specs import AtenOp

_built: dict[Callable[[], Any], Executor] = {}
_core_executors: dict[tuple, ThunderplugExecutor] = {}


def core_executor(aten_ops: list[AtenOp]) -> ThunderplugExecutor:
    """One core executor per distinct set of ATen ops (discover() is usually called with one)."""
    key = tuple((op.overload, op.decomposition) for op in aten_ops)
    if key not in _core_executors:
        import thunderplug

        _core_executors[key] = ThunderplugExecutor(aten_ops, version=thunderplug.__version__)
    return _core_executors[key]


def assemble_executors(
    host: PluginHost, *, only: Iterable[str] | None, exclude: Iterable[str], include_defaults: bool
) -> list[Executor]:
    """Core executor, the broadcast-grads executor, every selected plugin executor by priority, then
    thunder's defaults.

    A factory that raises marks its plugin ``failed`` (or re-raises under THUNDERPLUG_STRICT) and
    the rest of the list is still returned.
    """
    exclude = tuple(exclude)
    patches.install()
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
    return restrict_fusers(executors, host.fusion_claims())
