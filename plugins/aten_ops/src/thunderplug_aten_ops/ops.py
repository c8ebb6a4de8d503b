"""The ATen overloads this plugin defines: importing the category modules fills ``ALL_OPS``."""

from __future__ import annotations

from thunderplug_aten_ops import creation, elementwise, linalg, metadata, nn, reductions, shape  # noqa: F401
from thunderplug_aten_ops._registry import ALL_OPS

__all__ = ["ALL_OPS", "NOT_REGISTERED"]

#: core overloads this plugin leaves out on purpose, with why (docs/aten_coverage.md lists them)
NOT_REGISTERED = {
    "nonzero.default": "data-dependent output shape: thunder proxies and torch's FakeTensor meta need static shapes",
    "_embedding_bag.default": "four outputs whose offset2bag/bag_size/max_indices layouts are ATen-internal; "
    "not written yet (embedding + segment sums would express the sum/mean modes)",
    "convolution_backward.default": "a backward kernel: not written yet (thunder differentiates aten.convolution itself)",
    "native_layer_norm_backward.default": "a backward kernel: not written yet (thunder differentiates aten.native_layer_norm itself)",
    "native_group_norm_backward.default": "a backward kernel: not written yet (thunder differentiates aten.native_group_norm itself)",
    "avg_pool2d_backward.default": "a backward kernel: not written yet (thunder differentiates aten.avg_pool2d itself)",
    "max_pool2d_with_indices_backward.default": "a backward kernel: not written yet (thunder differentiates "
    "aten.max_pool2d_with_indices itself)",
}
