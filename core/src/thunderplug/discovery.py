"""Finding, loading and isolating plugins, and turning them into an ordered executor list.

Each entry point is loaded and called on its own: an import error, a missing shared library, a
hook that raises or a misspelled hook gives that plugin a status and a reason, and the others
still work. ``THUNDERPLUG_STRICT=1`` re-raises instead, for plugin authors.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

import pluggy

from thunderplug import hookspecs
from thunderplug.report import PluginStatus, Status
from thunderplug.specs import AtenOp, Claim, ExecutorSpec, Stage

ENTRY_POINT_GROUP = "thunderplug"

log = logging.getLogger("thunderplug")


class DuplicateRegistrationError(ValueError):
    """Two plugins provide the same executor name or ATen overload."""


class _PluginSkipped(Exception):
    """Internal: the plugin got a non-active status; stop processing it."""


def _names(value: str | None) -> set[str] | None:
    if value is None:
        return None
    return {part.strip() for part in value.split(",") if part.strip()}


class PluginHost:
    """A plugin manager plus everything its plugins registered.

    ``thunderplug.discover()`` uses one shared host that loads entry points; tests and tools make
    their own with ``load_entry_points=False`` and add plugin objects with :meth:`add_plugin`.
    """

    def __init__(self, *, load_entry_points: bool = True, environ: Mapping[str, str] | None = None):
        self._environ = os.environ if environ is None else environ
        self._load_entry_points = load_entry_points
        self._entry_points_loaded = False
        self._manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._manager.add_hookspecs(hookspecs)
        self._statuses: dict[str, PluginStatus] = {}
        self._executor_specs: dict[str, list[ExecutorSpec]] = {}
        self._aten_ops: dict[str, list[AtenOp]] = {}
        self._fusion_claims: dict[str, list[Claim]] = {}

    # -- loading ---------------------------------------------------------------------------

    @property
    def strict(self) -> bool:
        return self._environ.get("THUNDERPLUG_STRICT", "") not in ("", "0")

    def _blocked_reason(self, name: str) -> str | None:
        allowed = _names(self._environ.get("THUNDERPLUG_PLUGINS"))
        if allowed is not None and name not in allowed:
            return "not in THUNDERPLUG_PLUGINS"
        if name in (_names(self._environ.get("THUNDERPLUG_DISABLE")) or set()):
            return "listed in THUNDERPLUG_DISABLE"
        return None

    def _load(self) -> None:
        if self._entry_points_loaded or not self._load_entry_points:
            return
        self._entry_points_loaded = True
        for entry_point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
            self._load_entry_point(entry_point)

    def _load_entry_point(self, entry_point: importlib.metadata.EntryPoint) -> None:
        dist = entry_point.dist
        status = PluginStatus(
            name=entry_point.name,
            status=Status.ACTIVE,
            distribution=dist.metadata["Name"] if dist else None,
            version=dist.version if dist else None,
        )
        self._statuses[status.name] = status
        blocked = self._blocked_reason(status.name)
        if blocked:
            status.status, status.reason = Status.DISABLED, blocked
            return
        try:
            plugin = self._guarded(status, entry_point.load)
        except _PluginSkipped:
            return
        self._activate(plugin, status)

    def add_plugin(self, plugin: object, name: str, *, distribution: str | None = None) -> PluginStatus:
        """Register a plugin object directly (tests, notebooks), with the same isolation."""
        status = PluginStatus(name=name, status=Status.ACTIVE, distribution=distribution)
        self._statuses[name] = status
        blocked = self._blocked_reason(name)
        if blocked:
            status.status, status.reason = Status.DISABLED, blocked
        else:
            self._activate(plugin, status)
        return status

    def remove_plugin(self, name: str) -> None:
        if self._manager.has_plugin(name):
            self._manager.unregister(name=name)
        for registry in (self._statuses, self._executor_specs, self._aten_ops, self._fusion_claims):
            registry.pop(name, None)

    def _activate(self, plugin: object, status: PluginStatus) -> None:
        name = status.name
        try:
            self._guarded(status, self._validate_and_register, plugin, name)
            reason = self._guarded(status, self._call, name, "unavailable_reason")
            if reason:
                status.status, status.reason = Status.UNAVAILABLE, str(reason)
                self._manager.unregister(name=name)
                return
            specs: list[ExecutorSpec] = []
            ops: list[AtenOp] = []
            claims: list[Claim] = []
            self._guarded(status, self._call, name, "register_executors", register=specs.append)
            self._guarded(status, self._call, name, "register_aten_ops", register=ops.append)
            self._guarded(status, self._call, name, "register_claims", register=claims.append)
            specs += self._guarded(status, _claim_executor_specs, [c for c in claims if c.stage != Stage.FUSION])
        except _PluginSkipped:
            if self._manager.has_plugin(name):
                self._manager.unregister(name=name)
            return
        self._executor_specs[name] = specs
        self._aten_ops[name] = ops
        self._fusion_claims[name] = [c for c in claims if c.stage == Stage.FUSION]
        status.executors = [spec.name for spec in specs]
        status.aten_ops = len(ops)

    def _validate_and_register(self, plugin: object, name: str) -> None:
        self._manager.register(plugin, name=name)
        try:
            self._manager.check_pending()  # earlier plugins already passed, so a failure is this one's
        except pluggy.PluginValidationError:
            self._manager.unregister(name=name)
            raise

    def _call(self, name: str, hook_name: str, **kwargs: Any) -> Any:
        plugin = self._manager.get_plugin(name)
        others = [p for p in self._manager.get_plugins() if p is not plugin]
        results = self._manager.subset_hook_caller(hook_name, remove_plugins=others)(**kwargs)
        return next((r for r in results if r is not None), None)

    def _guarded(self, status: PluginStatus, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn``; on error record the plugin's status and raise :class:`_PluginSkipped`."""
        try:
            return fn(*args, **kwargs)
        except (ImportError, OSError) as error:
            outcome = Status.UNAVAILABLE
            caught = error
        except pluggy.PluginValidationError as error:
            outcome = Status.INVALID
            caught = error
        except Exception as error:  # noqa: BLE001 - a plugin must never take the others down
            outcome = Status.FAILED
            caught = error
        if self.strict:
            raise caught
        status.status, status.reason = outcome, f"{type(caught).__name__}: {caught}"
        log.info("thunderplug plugin %s is %s: %s", status.name, outcome.value, status.reason)
        raise _PluginSkipped from caught

    # -- results ---------------------------------------------------------------------------

    def report(self) -> list[PluginStatus]:
        """The status of every plugin seen, sorted by name."""
        self._load()
        return sorted(self._statuses.values(), key=lambda s: s.name)

    def aten_ops(self) -> list[AtenOp]:
        """All ATen overloads registered by active plugins; a duplicate is an error naming both."""
        self._load()
        providers: dict[Any, str] = {}
        ops: list[AtenOp] = []
        for plugin_name in sorted(self._aten_ops):
            for op in self._aten_ops[plugin_name]:
                if op.overload in providers:
                    raise DuplicateRegistrationError(
                        f"ATen overload {op.qualified_name} is registered by plugins "
                        f"{providers[op.overload]!r} and {plugin_name!r}; disable one of them"
                    )
                providers[op.overload] = plugin_name
                ops.append(op)
        return ops

    def fusion_claims(self) -> list[Claim]:
        """Restrictions active plugins put on fusion executors (``Stage.FUSION`` claims)."""
        self._load()
        return [claim for name in sorted(self._fusion_claims) for claim in self._fusion_claims[name]]

    def executor_specs(self, *, only: Iterable[str] | None = None, exclude: Iterable[str] = ()) -> list[ExecutorSpec]:
        """Selected executor specs in precedence order: priority (high first), then name.

        ``only``/``exclude`` match plugin names or executor names.
        """
        self._load()
        only_set = None if only is None else set(only)
        exclude_set = set(exclude)
        chosen: dict[str, tuple[ExecutorSpec, str]] = {}
        for plugin_name in sorted(self._executor_specs):
            for spec in self._executor_specs[plugin_name]:
                keys = {plugin_name, spec.name}
                if (only_set is not None and not keys & only_set) or keys & exclude_set:
                    continue
                if spec.name in chosen:
                    first = chosen[spec.name][1]
                    raise DuplicateRegistrationError(
                        f"executor {spec.name!r} is provided by more than one plugin:\n"
                        f"  - {first} ({self._statuses[first].distribution or 'no distribution'})\n"
                        f"  - {plugin_name} ({self._statuses[plugin_name].distribution or 'no distribution'})"
                    )
                chosen[spec.name] = (spec, plugin_name)
        return sorted((spec for spec, _ in chosen.values()), key=lambda spec: (-spec.priority, spec.name))

    def provider_of(self, executor_name: str) -> str | None:
        for plugin_name, specs in self._executor_specs.items():
            if any(spec.name == executor_name for spec in specs):
                return plugin_name
        return None

    def mark_failed(self, plugin_name: str, error: BaseException) -> None:
        """Record that building one of the plugin's executors failed; drop its registrations."""
        status = self._statuses[plugin_name]
        status.status, status.reason = Status.FAILED, f"{type(error).__name__}: {error}"
        self._executor_specs.pop(plugin_name, None)
        self._aten_ops.pop(plugin_name, None)
        log.info("thunderplug plugin %s failed: %s", plugin_name, status.reason)


def _claim_executor_specs(claims: list[Claim]) -> list[ExecutorSpec]:
    """One executor per ``Claim.executor`` name, built (importing thunder) only when selected."""
    by_executor: dict[str, list[Claim]] = {}
    for claim in claims:
        by_executor.setdefault(claim.executor, []).append(claim)

    def factory(name: str, grouped: list[Claim]):
        def build():
            from thunderplug.claims import claim_executor

            return claim_executor(name, grouped)

        return build

    return [
        ExecutorSpec(name, factory(name, grouped), max(c.priority for c in grouped), "claims: " + ", ".join(str(c.target) for c in grouped))
        for name, grouped in by_executor.items()
    ]


_default_host: PluginHost | None = None


def default_host() -> PluginHost:
    """The process-wide host that ``discover()`` and ``report()`` use."""
    global _default_host
    if _default_host is None:
        _default_host = PluginHost()
    return _default_host
