"""Warnings thunderplug gives its users: each one once per process, and all of them silenceable.

A broken plugin (invalid, failed, conflict) changes what ``discover()`` returns, so it deserves a
warning rather than a log line nobody sees (one that merely cannot run here is only listed); but a
warning on every call would bury the user's own output, so
each distinct notice is given once per process (under a lock: the first ``discover()`` may be
called from several threads at once).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Hashable


class ThunderplugWarning(UserWarning):
    """Something about the installed plugins or the settings the user should know.

    Filter it like any warning (``warnings.filterwarnings("ignore", category=ThunderplugWarning)``),
    or set ``THUNDERPLUG_QUIET=1`` / call ``discover(quiet=True)``.
    """


class RecompileWarning(ThunderplugWarning):
    """A jitted function hit its recompilation limit (see ``thunderplug.caching.recompiles``)."""


_given: set[Hashable] = set()
_lock = threading.Lock()


def warn_once(key: Hashable, message: str, category: type[Warning] = ThunderplugWarning, stacklevel: int = 3) -> bool:
    """Warn with ``message`` unless a notice with the same ``key`` was given before; True if warned."""
    with _lock:
        if key in _given:
            return False
        _given.add(key)
    warnings.warn(message, category, stacklevel=stacklevel)
    return True
