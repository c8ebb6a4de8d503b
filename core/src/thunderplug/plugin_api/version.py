"""The version of the thunderplug core (kept apart so that lower layers can read it)."""

__version__ = "0.1.0"
