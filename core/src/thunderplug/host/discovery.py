"""Finding, loading and isolating plugins, and turning them into ordered executor specs.

Each plugin is loaded and called on its own: an import error, a missing shared library, a hook
that raises, a misspelled hook, a registration of the wrong type or a name another plugin already
provides gives that plugin a status and a reason, and the others still work.
``THUNDERPLUG_STRICT=1`` re-raises instead, for plugin authors.

thunderplug's own executors are plugins too (:data:`DEFAULT_PLUGINS`), registered through the same
hooks before any entry point, so they are listed, ordered and excluded by the same rules.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pluggy

from thunderplug.plugin_api import hookspecs, settings
from thunderplug.plugin_api.notices import warn_once
from thunderplug.plugin_api.report import PluginStatus, Status
from thunderplug.plugin_api.specs import (
    CLAIM_TYPES,
    AtenKernelClaim,
    AtenOp,
    ExecutorSpec,
    Stage,
    accept_all,
    priority_ahead_of,
)
from thunderplug.plugin_api.version import __version__

ENTRY_POINT_GROUP = "thunderplug"

#: ``(plugin name, "module:attribute")`` of the plugins thunderplug itself provides. Each attribute
#: is called with the host and returns the plugin object. They are not subject to
#: ``THUNDERPLUG_PLUGINS`` or ``discover(only=...)`` (which choose among installed plugins), but
#: ``THUNDERPLUG_DISABLE`` and ``discover(exclude=...)`` name them like any other.
DEFAULT_PLUGINS: tuple[tuple[str, str], ...] = (
    ("thunderplug", "thunderplug.host.builtins:CorePlugin"),
    ("thunderplug_broadcast_grads", "thunderplug.host.builtins:BroadcastGradsPlugin"),
)

log = logging.getLogger("thunderplug")

#: Statuses ``discover()`` warns about: the plugin is broken, not merely unable to run here.
BROKEN = frozenset({Status.INVALID, Status.FAILED, Status.CONFLICT})


class DuplicateRegistrationError(ValueError):
    """Two plugins provide the same executor name or ATen overload (raised only in strict mode)."""


class InvalidRegistrationError(TypeError):
    """A plugin registered something that is not what the hook takes, or built a non-executor."""


class _PluginSkipped(Exception):
    """Internal: the plugin got a non-active status; stop processing it."""


class PluginHost:
    """A plugin manager plus everything its plugins registered.

    ``thunderplug.discover()`` uses one shared host that loads entry points; tests and tools make
    their own with ``load_entry_points=False`` and add plugin objects with :meth:`add_plugin`.
    All public methods may be called from several threads.
    """

    def __init__(self, *, load_entry_points: bool = True, environ: Mapping[str, str] | None = None):
        self._environ = os.environ if environ is None else environ
        self._load_entry_points = load_entry_points
        self._loaded = False
        self._lock = threading.RLock()
        self._manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._manager.add_hookspecs(hookspecs)
        self._statuses: dict[str, PluginStatus] = {}
        self._executor_specs: dict[str, list[ExecutorSpec]] = {}
        self._aten_ops: dict[str, list[AtenOp]] = {}
        self._fusion_claims: dict[str, list[Any]] = {}
        self._kernel_claims: dict[str, list[AtenKernelClaim]] = {}
        self._built: dict[ExecutorSpec, Any] = {}  # spec -> the Executor its factory built

    # -- settings --------------------------------------------------------------------------

    @property
    def strict(self) -> bool:
        return settings.flag(self._environ, settings.STRICT)

    @property
    def quiet(self) -> bool:
        return settings.flag(self._environ, settings.QUIET)

    def _blocked_reason(self, name: str, *, builtin: bool) -> str | None:
        allowed = settings.names(self._environ, settings.PLUGINS)
        if not builtin and allowed is not None and name not in allowed:
            return f"not in {settings.PLUGINS}"
        if name in (settings.names(self._environ, settings.DISABLE) or ()):
            return f"listed in {settings.DISABLE}"
        return None

    # -- loading ---------------------------------------------------------------------------

    def _load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            for name, path in DEFAULT_PLUGINS:
                self._load_default(name, path)
            if not self._load_entry_points:
                return
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
            for entry_point in sorted(entry_points, key=lambda ep: ep.name):
                self._load_entry_point(entry_point)
            self._warn_unknown_names()

    def _load_default(self, name: str, path: str) -> None:
        status = self._new_status(name, distribution="thunderplug", version=__version__, module=path)
        status.builtin = True
        if self._set_blocked(status):
            return
        module_name, _, attribute = path.partition(":")
        plugin = getattr(importlib.import_module(module_name), attribute)(self)
        self._activate(plugin, status)

    def _load_entry_point(self, entry_point: importlib.metadata.EntryPoint) -> None:
        dist = entry_point.dist
        status = self._new_status(
            entry_point.name,
            distribution=dist.metadata["Name"] if dist else None,
            version=dist.version if dist else None,
            module=entry_point.value,
        )
        if self._set_blocked(status):
            return
        try:
            plugin = self._guarded(status, entry_point.load)
        except _PluginSkipped:
            return
        self._activate(plugin, status)

    def add_plugin(self, plugin: object, name: str, *, distribution: str | None = None) -> PluginStatus:
        """Register a plugin object directly (tests, notebooks), with the same isolation."""
        with self._lock:
            self._load()
            module = getattr(plugin, "__name__", None) or f"{type(plugin).__module__}:{type(plugin).__qualname__}"
            status = self._new_status(name, distribution=distribution, module=module)
            if not self._set_blocked(status):
                self._activate(plugin, status)
            self._built.clear()  # executors built from all plugins' registrations (the core's ATen table) change
            return status

    def remove_plugin(self, name: str) -> None:
        with self._lock:
            if self._manager.has_plugin(name):
                self._manager.unregister(name=name)
            owned = (self._executor_specs, self._aten_ops, self._fusion_claims, self._kernel_claims)
            for registry in (self._statuses, *owned):
                registry.pop(name, None)
            self._built.clear()

    def _new_status(self, name: str, **fields: Any) -> PluginStatus:
        status = PluginStatus(name=name, status=Status.ACTIVE, **fields)
        previous = self._statuses.get(name)
        if previous is None or previous.status is not Status.ACTIVE:
            self._statuses[name] = status
        else:  # two distributions with one entry-point name: keep both rows, skip the second
            status.status = Status.CONFLICT
            status.reason = f"the plugin name {name!r} is already taken by {previous.provider}; skipped"
            self._statuses[f"{name} ({status.provider})"] = status
        return status

    def _set_blocked(self, status: PluginStatus) -> bool:
        if status.status is not Status.ACTIVE:
            return True
        blocked = self._blocked_reason(status.name, builtin=status.builtin)
        if blocked:
            status.status, status.reason = Status.DISABLED, blocked
        return bool(blocked)

    def _activate(self, plugin: object, status: PluginStatus) -> None:
        name = status.name
        try:
            self._guarded(status, self._validate_and_register, plugin, name)
            status.hooks = sorted(caller.name for caller in self._manager.get_hookcallers(plugin) or ())
            reason = self._guarded(status, self._call, name, "unavailable_reason")
            if reason:
                self._skip(status, Status.UNAVAILABLE, str(reason))
            specs: list[ExecutorSpec] = self._collect(status, "register_executors", ExecutorSpec)
            ops: list[AtenOp] = self._collect(status, "register_aten_ops", AtenOp)
            claims: list[Any] = self._collect(status, "register_claims", CLAIM_TYPES)
            specs += self._guarded(
                status,
                _claim_executor_specs,
                [c for c in claims if c.stage != Stage.FUSION],
                plugin=status.name,
                on_error=functools.partial(self.mark_failed, status.name),
            )
            specs = self._available(status, specs, offers_more=bool(ops or claims))
            self._check_conflicts(status, specs, ops)
        except _PluginSkipped:
            if self._manager.has_plugin(name):
                self._manager.unregister(name=name)
            return
        self._executor_specs[name] = specs
        self._aten_ops[name] = ops
        self._fusion_claims[name] = [c for c in claims if c.stage == Stage.FUSION]
        self._kernel_claims[name] = [c for c in claims if isinstance(c, AtenKernelClaim)]
        status.executors = [spec.name for spec in specs]
        status.aten_ops = len(ops)

    def _validate_and_register(self, plugin: object, name: str) -> None:
        self._manager.register(plugin, name=name)
        try:
            self._manager.check_pending()  # earlier plugins already passed, so a failure is this one's
        except pluggy.PluginValidationError as error:
            self._manager.unregister(name=name)
            raise pluggy.PluginValidationError(error.plugin, _with_suggestion(str(error))) from None

    def _call(self, name: str, hook_name: str, **kwargs: Any) -> Any:
        plugin = self._manager.get_plugin(name)
        others = [p for p in self._manager.get_plugins() if p is not plugin]
        results = self._manager.subset_hook_caller(hook_name, remove_plugins=others)(**kwargs)
        return next((r for r in results if r is not None), None)

    def _collect(self, status: PluginStatus, hook_name: str, expected: type | tuple[type, ...]) -> list[Any]:
        """Call ``hook_name`` with a ``register`` that refuses anything but ``expected``."""
        collected: list[Any] = []
        names = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))

        def register(item: Any) -> None:
            if not isinstance(item, expected):
                raise InvalidRegistrationError(
                    f"{hook_name} called register({item!r}), a {type(item).__name__}; it takes {names}"
                )
            collected.append(item)

        self._guarded(status, self._call, status.name, hook_name, register=register)
        return collected

    def _available(self, status: PluginStatus, specs: list[ExecutorSpec], *, offers_more: bool) -> list[ExecutorSpec]:
        """Drop the specs whose own ``unavailable_reason`` says no; a plugin left with nothing is unavailable."""
        available = []
        for spec in specs:
            reason = self._guarded(status, spec.unavailable_reason) if spec.unavailable_reason else None
            if reason:
                status.unavailable_executors[spec.name] = str(reason)
            else:
                available.append(spec)
        if specs and not available and not offers_more:
            self._skip(
                status, Status.UNAVAILABLE, "; ".join(f"{n}: {r}" for n, r in status.unavailable_executors.items())
            )
        return available

    def _check_conflicts(self, status: PluginStatus, specs: list[ExecutorSpec], ops: list[AtenOp]) -> None:
        """The first plugin to provide a name keeps it (defaults, then entry points by name); a later one is skipped."""
        for spec in specs:
            owner = self.provider_of(spec.name)
            if owner is not None:
                self._conflict(status, f"executor {spec.name!r}", owner)
        taken = {op.overload: owner for owner, owned in self._aten_ops.items() for op in owned}
        for op in ops:
            if op.overload in taken:
                self._conflict(status, f"ATen overload {op.qualified_name}", taken[op.overload])

    def _conflict(self, status: PluginStatus, what: str, owner: str) -> None:
        message = (
            f"{what} is provided by plugin {self._statuses[owner].provider} and by plugin {status.provider}; "
            f"{status.name!r} is skipped (uninstall one, or set {settings.DISABLE}={status.name})"
        )
        if self.strict:
            raise DuplicateRegistrationError(message)
        self._skip(status, Status.CONFLICT, message)

    def _skip(self, status: PluginStatus, outcome: Status, reason: str) -> None:
        status.status, status.reason = outcome, reason
        log.info("thunderplug plugin %s is %s: %s", status.name, outcome.value, reason)
        raise _PluginSkipped

    def _guarded(self, status: PluginStatus, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn``; on error record the plugin's status and raise :class:`_PluginSkipped`."""
        outcome: Status
        caught: Exception
        try:
            return fn(*args, **kwargs)
        except (ImportError, OSError) as error:
            outcome, caught = Status.UNAVAILABLE, error
        except (pluggy.PluginValidationError, InvalidRegistrationError) as error:
            outcome, caught = Status.INVALID, error
        except Exception as error:  # noqa: BLE001 - a plugin must never take the others down
            outcome, caught = Status.FAILED, error
        if self.strict:
            raise caught
        status.status, status.reason = outcome, f"{type(caught).__name__}: {caught}"
        log.info("thunderplug plugin %s is %s: %s", status.name, outcome.value, status.reason)
        raise _PluginSkipped from caught

    def _warn_unknown_names(self) -> None:
        known = sorted(self._statuses)
        for variable in (settings.PLUGINS, settings.DISABLE):
            for name in sorted((settings.names(self._environ, variable) or frozenset()) - set(known)):
                warn_once(
                    (variable, name),
                    f"{variable} names {name!r}, which is not an installed thunderplug plugin "
                    f"(installed: {', '.join(known)}); see `thunderplug plugins`",
                    stacklevel=5,
                )

    # -- results ---------------------------------------------------------------------------

    def report(self) -> list[PluginStatus]:
        """The status of every plugin seen: thunderplug's own first, then by name."""
        self._load()
        with self._lock:
            return sorted(self._statuses.values(), key=lambda s: (not s.builtin, s.name))

    def aten_ops(self) -> list[AtenOp]:
        """All ATen overloads registered by active plugins (conflicting plugins were skipped at load)."""
        self._load()
        with self._lock:
            return [op for name in sorted(self._aten_ops) for op in self._aten_ops[name]]

    def fusion_claims(self) -> list[Any]:
        """Restrictions active plugins put on fusion executors (``Stage.FUSION`` claims)."""
        self._load()
        with self._lock:
            return [claim for name in sorted(self._fusion_claims) for claim in self._fusion_claims[name]]

    def executor_specs(self, *, only: Iterable[str] | None = None, exclude: Iterable[str] = ()) -> list[ExecutorSpec]:
        """Selected executor specs in precedence order: priority (high first), then name.

        ``only`` and ``exclude`` match plugin names or executor names; ``only`` chooses among
        installed plugins, thunderplug's own stay unless excluded.
        """
        self._load()
        only_set = None if only is None else set(only)
        exclude_set = set(exclude)
        chosen: list[ExecutorSpec] = []
        with self._lock:
            for plugin_name, specs in self._executor_specs.items():
                for spec in specs:
                    keys = {plugin_name, spec.name}
                    selected = only_set is None or bool(keys & only_set) or self._statuses[plugin_name].builtin
                    if selected and not keys & exclude_set:
                        chosen.append(spec)
        return sorted(chosen, key=lambda spec: (-spec.priority, spec.name))

    def shadowed_claims(self, specs: list[ExecutorSpec]) -> dict[str, list[str]]:
        """Per executor of ``specs`` (discover()'s order), its kernel claims that never run because
        an executor ahead of it takes every call of the same overload: ``"<target>: shadowed by ..."``."""
        registered = {op.overload for op in self.aten_ops()}
        with self._lock:
            claims = [claim for owned in self._kernel_claims.values() for claim in owned]
        position = {spec.name: index for index, spec in enumerate(specs)}
        shadowed: dict[str, list[str]] = {}
        for claim in claims:
            if claim.executor not in position:
                continue
            for ahead in specs[: position[claim.executor]]:
                takes_all = (ahead.runs_registered_aten_ops and claim.overload in registered) or any(
                    other.executor == ahead.name and other.overload == claim.overload and other.checker is accept_all
                    for other in claims
                )
                if takes_all:
                    shadowed.setdefault(claim.executor, []).append(
                        f"{claim.target}: shadowed by executor {ahead.name!r} (priority {ahead.priority}), which "
                        f"comes first in discover()'s list and takes every call; set priority="
                        f"{priority_ahead_of(ahead.priority)} on the claim to run first"
                    )
                    break
        return shadowed

    def warn_shadowed(self, specs: list[ExecutorSpec], *, quiet: bool = False) -> None:
        """One warning per process for each kernel claim that can never run (see :meth:`shadowed_claims`)."""
        if quiet or self.quiet:
            return
        for executor, notes in self.shadowed_claims(specs).items():
            for note in notes:
                warn_once(
                    ("shadowed", executor, note),
                    f"the claim of executor {executor!r} (plugin {self.provider_of(executor)!r}) on {note}. "
                    f"{settings.QUIET}=1 or discover(quiet=True) silences this.",
                    stacklevel=5,
                )

    def provider_of(self, executor_name: str) -> str | None:
        """The name of the active plugin that registered ``executor_name``."""
        with self._lock:
            for plugin_name, specs in self._executor_specs.items():
                if any(spec.name == executor_name for spec in specs):
                    return plugin_name
        return None

    def build(self, spec: ExecutorSpec) -> Any | None:
        """The executor ``spec.factory()`` builds (once per host), or ``None`` if building failed,
        in which case its plugin is marked ``failed`` or ``invalid`` (strict mode re-raises)."""
        from thunder.extend import Executor

        with self._lock:
            if spec in self._built:
                return self._built[spec]
            plugin_name = self.provider_of(spec.name) or spec.name
            try:
                executor = spec.factory()
                if not isinstance(executor, Executor):
                    raise InvalidRegistrationError(
                        f"the factory of executor {spec.name!r} returned {executor!r}, a {type(executor).__name__}, "
                        "not a thunder.extend.Executor"
                    )
            except Exception as error:
                if self.strict:
                    raise
                self.mark_failed(plugin_name, error)
                return None
            self._built[spec] = executor
            return executor

    def mark_failed(self, plugin_name: str, error: BaseException) -> None:
        """Record that building one of the plugin's executors failed; drop everything it registered."""
        with self._lock:
            status = self._statuses[plugin_name]
            outcome = Status.INVALID if isinstance(error, InvalidRegistrationError) else Status.FAILED
            status.status, status.reason = outcome, f"{type(error).__name__}: {error}"
            for spec in self._executor_specs.pop(plugin_name, ()):
                self._built.pop(spec, None)
            self._aten_ops.pop(plugin_name, None)
            self._fusion_claims.pop(plugin_name, None)
            self._kernel_claims.pop(plugin_name, None)
            status.executors = []
            log.info("thunderplug plugin %s is %s: %s", plugin_name, outcome.value, status.reason)

    def warn_broken(self, *, quiet: bool = False) -> None:
        """One warning per process for each broken plugin (invalid, failed, conflict).

        A plugin that cannot run here (no CUDA, a missing optional package) is not broken: it is
        listed as ``unavailable`` by ``thunderplug plugins`` and never warned about, so CPU
        scripts stay quiet; disabled ones were chosen.
        """
        if quiet or self.quiet:
            return
        for status in self.report():
            if status.status not in BROKEN:
                continue
            warn_once(
                ("plugin", status.name, status.status, status.reason),
                f"thunderplug plugin {status.provider} is {status.status.value}: {status.reason}. "
                "Its executors are not in discover()'s list; `thunderplug plugins` shows every plugin. "
                f"{settings.QUIET}=1 or discover(quiet=True) silences this.",
                stacklevel=5,
            )


def _with_suggestion(message: str) -> str:
    """pluggy's ``unknown hook 'register_claim' ...``, plus the hook the author probably meant."""
    match = re.search(r"unknown hook '([^']+)'", message)
    hooks = [name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "thunderplug_spec")]
    close = difflib.get_close_matches(match.group(1), hooks, n=1, cutoff=0.6) if match else []
    if close:
        return f"{message}; did you mean {close[0]!r}?"
    return f"{message}; the hooks are {', '.join(sorted(hooks))}" if match else message


def _claim_executor_specs(
    claims: list[Any], *, plugin: str, on_error: Callable[[BaseException], None]
) -> list[ExecutorSpec]:
    """One executor per claim ``executor`` name, built (importing thunder) only when selected.
    A checker that raises later, while compiling, calls ``on_error`` (the plugin is marked failed)."""
    by_executor: dict[str, list[Any]] = {}
    for claim in claims:
        by_executor.setdefault(claim.executor, []).append(claim)

    def factory(name: str, grouped: list[Any]) -> Callable[[], Any]:
        def build() -> Any:
            from thunderplug.host.claims import claim_executor

            return claim_executor(name, grouped, plugin=plugin, on_error=on_error)

        return build

    return [
        ExecutorSpec(
            name,
            factory(name, grouped),
            max(c.priority for c in grouped),
            "claims: " + ", ".join(str(c.target) for c in grouped),
        )
        for name, grouped in by_executor.items()
    ]


_default_host: PluginHost | None = None
_default_host_lock = threading.Lock()


def default_host() -> PluginHost:
    """The process-wide host that ``discover()`` and ``report()`` use (loaded once, whichever thread asks first)."""
    global _default_host
    with _default_host_lock:
        if _default_host is None:
            _default_host = PluginHost()
        host = _default_host
    host._load()
    return host
