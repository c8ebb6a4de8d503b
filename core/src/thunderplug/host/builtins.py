"""thunderplug's own executors, registered as plugins through the same hooks as any other.

* ``thunderplug``: the core executor (subclass ops kept whole for autodiff and then unrolled,
  ``torch.ops.aten`` calls routed to the ATen symbols every plugin registered);
* ``thunderplug_broadcast_grads``: correct gradients for implicitly broadcast 0-dim tensors
  (``thunderplug.eager.broadcast_grads``).

They are listed by ``thunderplug plugins``, ordered by priority like every executor, and can be
left out with ``discover(exclude=[...])`` or ``THUNDERPLUG_DISABLE``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from thunderplug.plugin_api.hookspecs import hookimpl
from thunderplug.plugin_api.specs import ExecutorSpec, Priority

if TYPE_CHECKING:
    from thunderplug.host.discovery import PluginHost


class CorePlugin:
    """The core executor, built from the ATen ops the host's active plugins registered."""

    def __init__(self, host: PluginHost):
        self._host = host

    def _build(self) -> Any:
        from thunderplug.plugin_api.version import __version__
        from thunderplug.subclass.executor import ThunderplugExecutor

        return ThunderplugExecutor(self._host.aten_ops(), version=__version__)

    @hookimpl
    def register_executors(self, register: Any) -> None:
        register(
            ExecutorSpec(
                "thunderplug",
                self._build,
                Priority.CORE,
                "tensor-subclass ops kept whole through autodiff, then unrolled into ATen ops",
            )
        )


class BroadcastGradsPlugin:
    """Gradient rules for prims that implicitly broadcast a 0-dim tensor (thunder 0.2.6 gets them wrong)."""

    def __init__(self, host: PluginHost):
        del host  # same constructor as every default plugin; this one needs nothing from it

    @staticmethod
    def _build() -> Any:
        from thunderplug.eager import broadcast_grads  # imports thunder: only when selected

        return broadcast_grads.executor()

    @hookimpl
    def register_executors(self, register: Any) -> None:
        register(
            ExecutorSpec(
                "thunderplug_broadcast_grads",  # broadcast_grads.EXECUTOR_NAME, without importing thunder
                self._build,
                Priority.GRADIENT_RULES,
                "correct gradients for implicitly broadcast 0-dim tensors",
            )
        )
