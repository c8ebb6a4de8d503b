"""Tensor subclasses in thunder traces, one layer per module, imported in this order only
(tests/test_architecture.py lists every module, ``replay``, ``residuals``, ``inplace`` and
``gradient_layouts`` included):

``values`` (subclass proxies, layouts, boundary ops) -> ``plan`` (what an op's outputs are) ->
``unroll`` (``__torch_dispatch__`` on fakes under make_fx, replayed as ATen symbols) ->
``autodiff`` (the outer op's gradient, unrolled the same way) -> ``symbols`` (one trace symbol per
subclass op) -> ``dispatch`` (which symbol a call on subclass proxies becomes) -> ``distributed``
(FSDP2 live parameters, DTensor's API as subclass ops, functional collectives) -> ``executor``
(the ``thunderplug`` executor that unrolls subclass ops after autodiff) -> ``interception`` (the
lookasides and proxy hooks ``wiring.patches`` installs).
"""
