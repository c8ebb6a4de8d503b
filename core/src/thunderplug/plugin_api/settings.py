"""The ``THUNDERPLUG_*`` environment variables, parsed the way people write them.

Booleans accept ``1/true/yes/on`` and ``0/false/no/off`` (any case, empty meaning false); anything
else is a warning and counts as false, so ``THUNDERPLUG_STRICT=off`` never turns strict mode on.
Name lists are comma separated; an unset variable is ``None`` ("no restriction"), an empty one is
the empty set.
"""

from __future__ import annotations

from collections.abc import Mapping

from thunderplug.plugin_api.notices import warn_once

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"", "0", "false", "no", "off"})

STRICT = "THUNDERPLUG_STRICT"  #: re-raise plugin errors instead of reporting them
QUIET = "THUNDERPLUG_QUIET"  #: no warning about broken plugins
PLUGINS = "THUNDERPLUG_PLUGINS"  #: allowlist of plugin names
DISABLE = "THUNDERPLUG_DISABLE"  #: blocklist of plugin names
RECOMPILE_LIMIT = "THUNDERPLUG_RECOMPILE_LIMIT"  #: distinct subclass flatten contexts per input before a warning
KEEP_DECOMPOSITIONS = "THUNDERPLUG_KEEP_DECOMPOSITIONS"  #: last_traces keep the decompositions in subclass ops


def flag(environ: Mapping[str, str], variable: str) -> bool:
    """The boolean value of ``variable`` in ``environ`` (false when unset)."""
    raw = environ.get(variable, "")
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value not in FALSE:
        warn_once(
            (variable, raw),
            f"{variable}={raw!r} is not a boolean; treating it as false "
            f"(use one of {', '.join(sorted(TRUE))} or {', '.join(sorted(FALSE - {''}))})",
        )
    return False


def count(environ: Mapping[str, str], variable: str, default: int) -> int:
    """A non-negative integer setting; ``default`` when unset, and a warning when it is no integer."""
    raw = environ.get(variable, "").strip()
    if not raw:
        return default
    if raw.isdigit():
        return int(raw)
    warn_once((variable, raw), f"{variable}={raw!r} is not a non-negative integer; using {default}")
    return default


def names(environ: Mapping[str, str], variable: str) -> frozenset[str] | None:
    """The comma-separated names in ``variable``; ``None`` when it is unset."""
    value = environ.get(variable)
    if value is None:
        return None
    return frozenset(part.strip() for part in value.split(",") if part.strip())
