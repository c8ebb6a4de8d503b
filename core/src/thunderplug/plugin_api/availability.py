"""Cheap checks plugins use in ``unavailable_reason``: they never initialise CUDA or import heavy packages."""

from __future__ import annotations

import importlib.util


def cuda_unavailable_reason() -> str | None:
    """``None`` when a CUDA device is usable, else why not (the same text the test marker shows)."""
    import torch

    if torch.version.cuda is None:
        return "no CUDA: this torch build has no CUDA support"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def missing_package_reason(module: str, install_hint: str) -> str | None:
    """``None`` when ``module`` can be imported, else which package is missing and how to get it."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"package {module!r} is not installed ({install_hint})"
