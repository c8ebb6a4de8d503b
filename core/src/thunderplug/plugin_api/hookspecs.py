"""The hooks a thunderplug plugin may implement.

A plugin is a module (or object) registered under the ``thunderplug`` entry-point group whose
functions are marked with :data:`thunderplug.hookimpl`. Every hook is called once per plugin, in
isolation, when the plugin is loaded; see ``docs/hooks.md``.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from thunderplug.plugin_api.specs import AtenOp, Claim, ExecutorSpec

PROJECT_NAME = "thunderplug"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def unavailable_reason() -> str | None:
    """Say why this plugin cannot run on this machine, or return ``None`` when it can.

    Called first, before any other hook of the plugin. Must be cheap and must not initialise CUDA
    or import heavy optional packages: check ``torch.cuda.is_available()`` and
    ``importlib.util.find_spec`` instead. A string makes the plugin ``unavailable`` with that
    reason, and its other hooks are not called.
    """


@hookspec
def register_executors(register: Callable[[ExecutorSpec], None]) -> None:
    """Call ``register(ExecutorSpec(...))`` for each thunder executor this plugin provides.

    Called once when the plugin is loaded and available. ``discover()`` orders executors by
    ``priority`` (higher first) then name, asks each spec's own ``unavailable_reason`` (if any),
    and builds each through its ``factory`` only when it is selected. Registering anything but an
    ``ExecutorSpec`` makes the plugin ``invalid``; a name an earlier plugin registered makes it
    ``conflict``.
    """


@hookspec
def register_aten_ops(register: Callable[[AtenOp], None]) -> None:
    """Call ``register(AtenOp(...))`` for each ``torch.ops.aten`` overload this plugin defines.

    Called once when the plugin is loaded and available. The core turns each into a thunder
    symbol with id ``torch.ops.aten.<op>.<overload>``, makes both ``torch.ops.aten.<op>(...)``
    and ``torch.ops.aten.<op>.<overload>(...)`` resolve to it inside ``thunder.jit``, and checks
    the decomposition's output metadata against torch's own meta kernel. An overload an earlier
    plugin registered makes this plugin ``conflict`` (the reason names both).
    """


@hookspec
def register_claims(register: Callable[[Claim], None]) -> None:
    """Call ``register(claim)`` for each op one of this plugin's executors takes; ``claim`` is a
    ``SubclassOpClaim``, ``FunctionClaim``, ``AtenKernelClaim`` or ``FusionFilter``.

    Called once when the plugin is loaded and available. The core turns the claims into thunder
    executors (one per ``executor`` name) and orders them by ``priority`` with the other
    executors, so that a before-autodiff claim is asked before any fuser, whatever the install
    order. See docs/claims.md.
    """
