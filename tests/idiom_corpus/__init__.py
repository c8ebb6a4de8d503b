"""The idiom corpus (issue 42 item 2): small training programs of idioms users write first, each run
3 AdamW steps under eager (the specification), discover(), stock thunder.jit and
torch.compile(backend="aot_eager"); ``python -m tests.idiom_corpus.report`` prints the table."""

from __future__ import annotations

import importlib
import os

from .program import REGISTRY, Idiom

#: the family modules, in the table's order
FAMILIES = (
    "checkpointing", "autograd_functions", "hooks", "parametrizations", "rnns", "attention", "complex_numbers",
    "distributions", "rng", "control_flow", "autocast", "functional", "embeddings", "inplace_buffers", "training",
    "vision", "hf", "litgpt_models", "quantization",
)  # fmt: skip
#: set to 1 to include the heavy programs (full torchvision models, DETR)
HEAVY_FLAG = "THUNDERPLUG_IDIOMS_HEAVY"


def all_idioms(heavy: bool | None = None) -> list[Idiom]:
    """Every program, heavy ones only when asked (default: the environment flag)."""
    for family in FAMILIES:
        importlib.import_module(f"{__name__}.{family}")
    if heavy is None:
        heavy = os.environ.get(HEAVY_FLAG) == "1"
    return [entry for entry in REGISTRY if heavy or not entry.heavy]
