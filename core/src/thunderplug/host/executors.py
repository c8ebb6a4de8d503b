"""Turning what plugins registered into the executor list ``thunder.jit`` takes."""

from __future__ import annotations

from collections.abc import Iterable

import thunder
from thunder.extend import Executor

from thunderplug.host.claims import restrict_fusers
from thunderplug.host.discovery import PluginHost


def assemble_executors(
    host: PluginHost,
    *,
    only: Iterable[str] | None,
    exclude: Iterable[str],
    include_defaults: bool,
    quiet: bool = False,
) -> list[Executor]:
    """Every selected executor by priority (thunderplug's own first), then thunder's defaults.

    A factory that raises or builds something else marks its plugin ``failed``/``invalid`` (or
    re-raises under THUNDERPLUG_STRICT) and the rest of the list is still returned.
    """
    specs = host.executor_specs(only=only, exclude=exclude)
    built = [(spec, host.build(spec)) for spec in specs]
    # a plugin whose later executor failed to build is dropped whole, its earlier ones included
    executors = [ex for spec, ex in built if ex is not None and host.provider_of(spec.name) is not None]
    host.warn_broken(quiet=quiet)
    host.warn_shadowed([spec for spec in specs if host.provider_of(spec.name) is not None], quiet=quiet)
    if include_defaults:
        names = {executor.name for executor in executors}
        executors += [ex for ex in thunder.get_default_executors() if ex.name not in names]
    return restrict_fusers(executors, host.fusion_claims())
