"""Idioms of real model code (found in transformers) that thunder 0.2.6 rejects or computes otherwise
than eager, each alone, forward and backward against eager (wiring.fixes)."""

import copy
import dataclasses
import sys
from collections.abc import Sequence

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunderplug


def _both(fn, *args):
    """(eager result, eager grads, discover() result, discover() grads) of ``fn(*args).sum()``."""
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    expected = fn(*args)
    expected_grads = torch.autograd.grad(expected.sum(), leaves)
    actual = thunder.jit(fn, executors=thunderplug.discover())(*args)
    actual_grads = torch.autograd.grad(actual.sum(), leaves)
    return expected, expected_grads, actual, actual_grads


def _assert_bit_identical(fn, *args):
    expected, expected_grads, actual, actual_grads = _both(fn, *args)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    for a, e in zip(actual_grads, expected_grads, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


class _LayerView(Sequence):
    """A Sequence whose ``__len__`` reads what ``__init__`` sets (transformers' ``_PerLayerConfigView``)."""

    def __init__(self, scales):
        self._scales = scales

    def __len__(self):
        return len(self._scales)

    def __getitem__(self, index):
        return self._scales[index]


def _scaled_by_view(x):
    view = _LayerView([2.0, 3.0])
    return x * view[0] + x * view[len(view) - 1]


def test_user_sequence_constructed_inside_the_function():
    _assert_bit_identical(_scaled_by_view, torch.randn(4, requires_grad=True))


def test_stock_thunder_fails_on_that_sequence():
    with pytest.raises(Exception, match="_scales"):
        thunder.jit(_scaled_by_view)(torch.randn(4))


def _grow_cache(k):
    cache = torch.tensor([], dtype=k.dtype)  # transformers' DynamicLayer starts from this
    cache = torch.cat([cache, k], dim=-2)
    return torch.cat([cache, k * 2], dim=-2)


def test_cat_skips_legacy_empty_tensors_as_eager():
    _assert_bit_identical(_grow_cache, torch.randn(2, 3, 4, requires_grad=True))


def test_cat_of_legacy_empty_tensors_promotes_like_eager():
    def promote(k):
        return torch.cat([torch.tensor([], dtype=torch.float64), k], dim=-1)

    k = torch.randn(2, 3)
    expected = promote(k)
    actual = thunder.jit(promote, executors=thunderplug.discover())(k)
    assert actual.dtype == expected.dtype == torch.float64
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_stock_thunder_fails_on_legacy_empty_tensors():
    with pytest.raises(IndexError, match="Expected dimension"):
        thunder.jit(_grow_cache)(torch.randn(2, 3, 4))


def _gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _gqa_inputs():
    torch.manual_seed(0)
    return (torch.randn(2, 4, 8, 16, requires_grad=True), torch.randn(2, 2, 8, 16, requires_grad=True),
            torch.randn(2, 2, 8, 16, requires_grad=True))


def test_sdpa_enable_gqa_as_eager():
    _assert_bit_identical(_gqa, *_gqa_inputs())


def test_stock_thunder_rejects_enable_gqa():
    with pytest.raises(TypeError, match="enable_gqa"):
        thunder.jit(_gqa)(*_gqa_inputs())


class _LossBuiltInForward(torch.nn.Module):
    """transformers' ``BertForMaskedLM``: the loss module is constructed in forward (it registers a buffer)."""

    def forward(self, logits, target):
        return torch.nn.CrossEntropyLoss()(logits, target)


def test_module_constructed_inside_forward():
    logits, target = torch.randn(4, 5, requires_grad=True), torch.tensor([0, 1, 4, 2])
    _assert_bit_identical(_LossBuiltInForward(), logits, target)


def test_stock_thunder_fails_on_a_module_constructed_inside_forward():
    with pytest.raises((AssertionError, RuntimeError)):
        thunder.jit(_LossBuiltInForward())(torch.randn(4, 5), torch.tensor([0, 1, 4, 2]))


def _rms_norm(x, weight):
    """transformers' LlamaRMSNorm: ``x.to(torch.float32)`` is ``x`` itself on float32 input, so ``x``'s
    three uses (here, the residual) get their gradients summed in eager's order."""
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + 1e-6)).to(x.dtype) + x


def _rms_norm_args():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 64, 64, generator=g).requires_grad_(), torch.randn(64, generator=g).requires_grad_()


def test_no_op_to_gradients_summed_as_eager():
    _assert_bit_identical(_rms_norm, *_rms_norm_args())


def test_no_op_to_returns_the_tensor_itself_and_other_to_calls_convert():
    x = torch.randn(3, 4)

    def conversions(x):
        return x.to(torch.float32), x.to("cpu"), x.to(x), x.to(torch.float64), x.to(torch.float32, copy=True)

    expected = conversions(x)
    actual = thunder.jit(conversions, executors=thunderplug.discover())(x)
    assert [a is x for a in actual] == [e is x for e in expected] == [True, True, True, False, False]
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and torch.equal(a, e)


class _Cache:
    """transformers' StaticCache in miniature: allocates a tensor when first updated and tags it and its
    length for Dynamo (thunder failed replaying the tag: `trying to set ._dynamo_static_input_type`)."""

    def __init__(self):
        self.length = torch.tensor(0)

    def update(self, x):
        self.keys = torch.zeros(3)
        torch._dynamo.mark_static_address(self.keys)
        torch._dynamo.mark_static_address(self.length)
        self.length.add_(x.shape[0])
        return x * self.length


def test_mark_static_address_inside_jitted_code_does_nothing():
    x = torch.randn(3)
    eager_cache, cache = _Cache(), _Cache()
    expected = eager_cache.update(x)
    actual = thunder.jit(lambda c, x: c.update(x), executors=thunderplug.discover())(cache, x)
    assert torch.equal(actual, expected) and torch.equal(cache.length, eager_cache.length)


class _LazyCache:
    """transformers' ``StaticLayer``: the first update allocates the keys and sets several attributes,
    every update writes in place into the keys and returns them."""

    def __init__(self):
        self.initialized = False
        self.length = torch.tensor(0)

    def update(self, x):
        if not self.initialized:
            self.size = 6
            self.keys = torch.zeros(self.size, x.shape[1])
            self.initialized = True
        positions = torch.arange(x.shape[0]) + self.length
        self.length.add_(x.shape[0])
        self.keys.index_copy_(0, positions, x)
        return self.keys * 2


def _updates(update, cache):
    g = torch.Generator().manual_seed(0)
    return [update(cache, torch.randn(n, 4, generator=g)) for n in (3, 1, 1)]


def test_every_attribute_written_on_an_object_reaches_it():
    eager_cache, cache = _LazyCache(), _LazyCache()
    expected = _updates(lambda c, x: c.update(x), eager_cache)
    jitted = thunder.jit(lambda c, x: c.update(x), executors=thunderplug.discover())
    actual = _updates(jitted, cache)
    assert vars(cache).keys() == vars(eager_cache).keys() and cache.initialized and cache.size == 6
    assert torch.equal(cache.keys, eager_cache.keys) and torch.equal(cache.length, eager_cache.length)
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)
    assert thunder.cache_misses(jitted) == 2  # the allocating call, then the updates


def test_stock_thunder_keeps_only_the_first_attribute_written():
    cache = _LazyCache()
    _updates(thunder.jit(lambda c, x: c.update(x)), cache)
    assert vars(cache).keys() == {"initialized", "length", "size"}  # the first written only: no keys, and
    assert not cache.initialized  # every call allocated them afresh


@dataclasses.dataclass
class _Output:
    """transformers' ``ModelOutput``: built by the forward, then given the hidden states it collected."""

    logits: torch.Tensor
    hidden_states: tuple | None = None

    def __setitem__(self, key, value):
        super().__setattr__(key, value)


def _with_hidden_states(x, w):
    first = x @ w
    out = _Output(first.tanh())
    out["hidden_states"] = (x, first)
    return out


def test_attribute_written_after_construction_is_returned():
    x, w = torch.randn(3, 4), torch.randn(4, 4, requires_grad=True)
    expected = _with_hidden_states(x, w)
    actual = thunder.jit(_with_hidden_states, executors=thunderplug.discover())(x, w)
    assert isinstance(actual.hidden_states, tuple) and len(actual.hidden_states) == 2
    for a, e in zip((actual.logits, *actual.hidden_states), (expected.logits, *expected.hidden_states), strict=True):
        assert torch.equal(a, e)
    grads = [torch.autograd.grad(o.logits.sum() + 3 * o.hidden_states[1].sum(), w)[0] for o in (actual, expected)]
    assert torch.equal(*grads)


def test_stock_thunder_returns_the_value_before_the_write():
    out = thunder.jit(_with_hidden_states)(torch.randn(3, 4), torch.randn(4, 4))
    assert out.hidden_states is None


class _HooksOnFirstCall(torch.nn.Module):
    """transformers 5's output capturing: the first forward registers a hook on a submodule."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = torch.nn.Linear(4, 4)
        self.hooked = False

    def forward(self, x):
        if not self.hooked:
            self.inner.register_forward_pre_hook(lambda module, args: (args[0] * 3,))
            self.inner.register_forward_hook(lambda module, args, out: out.tanh())
            self.hooked = True
        return self.inner(x) * 2


def test_hooks_registered_inside_jitted_code_as_eager():
    x = torch.randn(2, 4)
    eager, model = _HooksOnFirstCall(), _HooksOnFirstCall()
    jitted = thunder.jit(model, executors=thunderplug.discover())
    for _ in range(2):
        expected, actual = eager(x), jitted(x)
        assert torch.equal(actual, expected)
        grads = [torch.autograd.grad(out.sum(), m.inner.weight)[0] for out, m in ((actual, model), (expected, eager))]
        assert torch.equal(*grads)
    assert len(model.inner._forward_hooks) == len(model.inner._forward_pre_hooks) == 1 and model.hooked


def test_stock_thunder_fails_on_hooks_registered_inside_jitted_code():
    with pytest.raises(RuntimeError, match="Expected"):  # its prologue guards torch's hook counter
        thunder.jit(_HooksOnFirstCall())(torch.randn(2, 4))


class _Generator(torch.nn.Module):
    """A model with a method that calls the model (transformers' ``generate``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.step = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.step(x).tanh()

    def generate(self, x, steps):
        outs = [x]
        for i in range(steps):
            outs.append(self(outs[-1]) if i % 2 else self.forward(outs[-1]))
        return torch.stack(outs)


def test_a_method_of_the_model_calls_the_compiled_module():
    x = torch.randn(2, 4)
    model = _Generator()
    jitted = thunder.jit(model, executors=thunderplug.discover())
    with torch.no_grad():
        assert torch.equal(jitted.generate(x, 4), model.generate(x, 4))
    assert (thunder.cache_misses(jitted), thunder.cache_hits(jitted)) == (1, 3)  # every step compiled, once


def test_stock_thunder_runs_a_method_of_the_model_uncompiled():
    jitted = thunder.jit(_Generator())
    with torch.no_grad():
        jitted.generate(torch.randn(2, 4), 4)
    assert thunder.cache_misses(jitted) + thunder.cache_hits(jitted) == 0


class _SetsFlag(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.step = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.first = not hasattr(self, "first")
        self.seen = x.shape
        return self.step(x)


def test_attributes_written_on_the_jitted_module_reach_it():
    model = _SetsFlag()
    thunder.jit(model, executors=thunderplug.discover())(torch.randn(2, 4))
    assert (model.first, model.seen) == (True, torch.Size([2, 4]))


def test_stock_thunder_drops_attributes_written_on_the_jitted_module():
    model = _SetsFlag()
    thunder.jit(model)(torch.randn(2, 4))
    assert not hasattr(model, "first")


HOOK_SCALE = 2.0  # read by _scaling_hook: the prologue guards it through the module's hook table


def _scaling_hook(module, args, output):
    return output * HOOK_SCALE


def _hooked_linear():
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 4)
    module.register_forward_hook(_scaling_hook)
    return module


def test_a_hook_of_the_jitted_module_reading_a_global_as_eager(monkeypatch):
    """Its table is read from the module (thunder read the ThunderModule's, empty: ``KeyError``), and the
    guard on the global it reads holds: a new value compiles again."""
    module, x = _hooked_linear(), torch.randn(2, 4, requires_grad=True)
    jitted = thunder.jit(module, executors=thunderplug.discover(quiet=True))
    for _ in range(2):
        torch.testing.assert_close(jitted(x), module(x), rtol=0, atol=0)
    (grad,) = torch.autograd.grad(jitted(x).sum(), x)
    (expected,) = torch.autograd.grad(module(x).sum(), x)
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)
    assert thunder.cache_misses(jitted) == 1
    monkeypatch.setattr(sys.modules[__name__], "HOOK_SCALE", 3.0)
    torch.testing.assert_close(jitted(x), module(x), rtol=0, atol=0)
    assert thunder.cache_misses(jitted) == 2


def test_stock_thunder_fails_on_a_hook_of_the_jitted_module_reading_a_global():
    with pytest.raises(KeyError):
        thunder.jit(_hooked_linear())(torch.randn(2, 4))


class _LazyBuffer:
    """Allocates on first use from the input's dtype (transformers 4.57's ``StaticLayer``)."""

    def __init__(self):
        self.ready = False

    def fill(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ready:
            self.dtype, self.kind = x.dtype, "lazy"
            self.store = torch.zeros_like(x)
            self.ready = True
        self.store.add_(x)
        return x * 2


def _fill(x, buffer):
    return buffer.fill(x)


def test_dtype_and_string_attributes_written_on_an_argument_reach_it():
    x = torch.randn(3, dtype=torch.float64)
    jitted = thunder.jit(_fill, executors=thunderplug.discover(quiet=True))
    for _ in range(2):  # a fresh object each call: the cached program writes them too
        ours, theirs = _LazyBuffer(), _LazyBuffer()
        torch.testing.assert_close(jitted(x, ours), _fill(x, theirs), rtol=0, atol=0)
        assert (ours.dtype, ours.kind, ours.ready) == (torch.float64, "lazy", True)
        assert type(ours.dtype) is torch.dtype
        torch.testing.assert_close(ours.store, theirs.store, rtol=0, atol=0)
    assert thunder.cache_misses(jitted) == 1


def test_stock_thunder_fails_on_a_dtype_attribute_written_on_an_argument():
    with pytest.raises(AssertionError, match="trying to set .dtype"):
        thunder.jit(_fill)(torch.randn(3), _LazyBuffer())


def _set_a_function(x, box):
    box.transform = lambda y: y + 1
    return x * 2


def test_a_function_written_on_an_argument_is_refused_by_name():
    """thunder cannot replay it after the call: refused, naming where the attribute is."""
    box = _LazyBuffer()
    jitted = thunder.jit(_set_a_function, executors=thunderplug.discover(quiet=True))
    with pytest.raises(NotImplementedError, match=r"sets `args\[1\]\.transform` to a function"):
        jitted(torch.randn(3), box)
    assert not hasattr(box, "transform")


def test_stock_thunder_fails_on_a_function_written_on_an_argument():
    with pytest.raises(AssertionError, match="trying to set .transform"):
        thunder.jit(_set_a_function)(torch.randn(3), _LazyBuffer())


class _Layer:
    """A plain object holding tensors (transformers' ``DynamicLayer``)."""

    def __init__(self):
        self.keys, self.values, self.is_initialized = None, None, False

    def update(self, keys, values):
        self.keys, self.values, self.is_initialized = keys, values, True


class _LayeredCache:
    def __init__(self, layers):
        self.layers = [_Layer() for _ in range(layers)]
        self.offloading = False


def _returns_a_cache(x, w):
    cache = _LayeredCache(2)
    for i, layer in enumerate(cache.layers):
        layer.update(x * w * (i + 1), x.sin())
    return (x @ w).sum(), cache


def test_an_object_made_inside_and_returned_as_eager():
    """transformers' ``DynamicCache`` (``use_cache=True``, also in training): returned as a new instance of its
    class holding the computed tensors, which carry their gradients."""
    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    for call in (_returns_a_cache, thunder.jit(_returns_a_cache, executors=thunderplug.discover())):
        result = call(x, w)
        cache = result[1]
        assert type(cache) is _LayeredCache and [type(layer) for layer in cache.layers] == [_Layer, _Layer]
        assert cache.offloading is False and all(layer.is_initialized for layer in cache.layers)
        total = result[0] + sum((layer.keys * 2 + layer.values).sum() for layer in cache.layers)
        grads = torch.autograd.grad(total, [x, w])
        if call is _returns_a_cache:
            expected, expected_grads = result, grads
    for layer, eager_layer in zip(cache.layers, expected[1].layers, strict=True):
        assert torch.equal(layer.keys, eager_layer.keys) and torch.equal(layer.values, eager_layer.values)
    assert all(torch.equal(a, e) for a, e in zip(grads, expected_grads, strict=True))


def test_stock_thunder_fails_on_an_object_made_inside_and_returned():
    with pytest.raises(NotImplementedError, match="unhandled value of type"):
        thunder.jit(_returns_a_cache)(torch.randn(4, 4), torch.randn(4, 4))


def _returns_a_cache_in_dict_literals(x, w):
    cache = _LayeredCache(2)
    for i, layer in enumerate(cache.layers):
        layer.update(x * w * (i + 1), x.sin())
    name = "cache"
    # BUILD_CONST_KEY_MAP, BUILD_MAP (a key computed), a repeated key (the last value wins), nested
    return {"loss": (x @ w).sum(), "cache": cache}, {name: cache, "loss": x.sum(), "loss": w.sum()}, {"d": {1: cache}}  # noqa: F601


def _cache_total(result) -> torch.Tensor:
    caches = (result[0]["cache"], result[1]["cache"], result[2]["d"][1])
    return result[0]["loss"] + result[1]["loss"] + sum(
        (layer.keys * (i + 2) + layer.values).sum() for i, cache in enumerate(caches) for layer in cache.layers
    )


def test_an_object_returned_in_a_dict_literal_as_eager():
    """``return {"cache": cache}``: thunder's dict literal forgot its items, and the cache reached the caller
    holding proxies (silently); it is rebuilt holding the computed tensors, with their gradients."""
    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    expected = _returns_a_cache_in_dict_literals(x, w)
    expected_grads = torch.autograd.grad(_cache_total(expected), [x, w])
    result = thunder.jit(_returns_a_cache_in_dict_literals, executors=thunderplug.discover())(x, w)
    assert [list(d) for d in result] == [list(d) for d in expected]
    for cache, eager_cache in zip((result[0]["cache"], result[1]["cache"], result[2]["d"][1]),
                                  (expected[0]["cache"], expected[1]["cache"], expected[2]["d"][1]), strict=True):
        assert type(cache) is _LayeredCache
        for layer, eager_layer in zip(cache.layers, eager_cache.layers, strict=True):
            assert type(layer.keys) is torch.Tensor and torch.equal(layer.keys, eager_layer.keys)
            assert torch.equal(layer.values, eager_layer.values)
    assert torch.equal(result[1]["loss"], expected[1]["loss"])
    grads = torch.autograd.grad(_cache_total(result), [x, w])
    assert all(torch.equal(a, e) for a, e in zip(grads, expected_grads, strict=True))


def test_stock_thunder_returns_proxies_in_a_dict_literal():
    from thunder.core.proxies import TensorProxy

    result = thunder.jit(_returns_a_cache_in_dict_literals)(torch.randn(4, 4), torch.randn(4, 4))
    assert isinstance(result[0]["cache"].layers[0].keys, TensorProxy)  # silently wrong


def _cache_through_a_list_call(x, w):
    cache = _LayeredCache(1)
    cache.layers[0].update(x * w, x.sin())
    return (x @ w,) + tuple([cache])  # tuple() of a list: thunder keeps no wrapper for the cache


def _cache_written_through_its_dict(x, w):
    cache = _LayeredCache(2)
    vars(cache.layers[0]).update(keys=x * w, values=x.sin())
    cache.layers[1].__dict__["keys"] = x * w * 2
    cache.layers[1].__dict__["values"] = x.cos()
    return (x @ w).sum(), cache


@pytest.mark.parametrize("fn", [_cache_through_a_list_call, _cache_written_through_its_dict])
def test_an_object_thunder_lost_track_of_is_rebuilt_as_eager(fn):
    """A returned object, or an attribute of one, that thunder kept no current wrapper for came back as it was
    in tracing: holding proxies (Falcon's and BLOOM's cache with ``return_dict=False``), or with the value an
    attribute had before a write through its ``__dict__`` (silently, both)."""
    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    results = [fn(x, w), thunder.jit(fn, executors=thunderplug.discover())(x, w)]
    grads = []
    for result in results:
        cache = result[1]
        assert type(cache) is _LayeredCache
        assert all(type(layer.keys) is torch.Tensor and type(layer.values) is torch.Tensor for layer in cache.layers)
        total = result[0].sum() + sum((layer.keys * 2 + layer.values).sum() for layer in cache.layers)
        grads.append(torch.autograd.grad(total, [x, w]))
    (expected, actual) = (results[0][1], results[1][1])
    for layer, eager_layer in zip(actual.layers, expected.layers, strict=True):
        assert torch.equal(layer.keys, eager_layer.keys) and torch.equal(layer.values, eager_layer.values)
    assert all(torch.equal(a, e) for a, e in zip(grads[1], grads[0], strict=True))


class _Config:
    """A plain config (transformers' ``PretrainedConfig``): copied with ``copy.deepcopy``."""

    def __init__(self):
        self.layers, self.scale, self.sub = 2, 3.0, {"bias": 0.5, "names": ["q", "k"]}


_COPIED_CONFIG = _Config()


def _scaled_by_a_copied_config(x):
    deep, shallow = copy.deepcopy(_COPIED_CONFIG), copy.copy(_COPIED_CONFIG)
    deep.scale = 5.0  # the copy's own attribute, the original's unchanged
    return x * deep.scale * deep.layers + deep.sub["bias"] + shallow.scale * len(shallow.sub["names"])


def test_a_deep_copied_config_as_eager():
    """``copy.deepcopy``/``copy.copy`` of an object (T5's and Whisper's ``config.get_text_config(decoder=True)``,
    which builds their default cache): thunder failed on the copy's ``__dict__``."""
    _assert_bit_identical(_scaled_by_a_copied_config, torch.randn(3, requires_grad=True))
    assert _COPIED_CONFIG.scale == 3.0


def test_stock_thunder_fails_on_a_copied_config():
    with pytest.raises(Exception, match="_mapping|generator' has no len"):
        thunder.jit(_scaled_by_a_copied_config)(torch.randn(3))


class _IndexedLayer(torch.nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index

    def forward(self, x, updated):
        updated[self.index] = True  # an input's number as a key (transformers' ``is_updated[layer_idx]``)
        return x * (self.index + 1)


class _Indexed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_IndexedLayer(i) for i in range(2)])

    def forward(self, x):
        updated = {}
        for layer in self.layers:
            x = layer(x, updated)
        return x, updated


def test_a_returned_dict_keyed_by_an_input_number_as_eager():
    """thunder rebuilt the key as a proxy of the input (``unhashable type: 'AnyProxy'``)."""
    x = torch.randn(3, requires_grad=True)
    expected = _Indexed()(x)
    actual = thunder.jit(_Indexed(), executors=thunderplug.discover())(x)
    assert actual[1] == expected[1] == {0: True, 1: True}
    assert torch.equal(actual[0], expected[0])


def _sliding_window(x):
    return x[:, -4095:] * 2 + x[:, :-4095].sum()  # keeps all of a length-16 dim, as Python slices do


def test_slice_bounds_below_minus_the_length_as_eager():
    _assert_bit_identical(_sliding_window, torch.randn(3, 16, requires_grad=True))


def test_stock_thunder_refuses_slice_bounds_below_minus_the_length():
    with pytest.raises(RuntimeError, match="not a valid index"):
        thunder.jit(_sliding_window)(torch.randn(3, 16))


class _MappedConfig:
    """A config mapping standard names onto its own in ``__getattribute__`` (transformers' ``attribute_map``)."""

    attribute_map = {"num_hidden_layers": "n_layer"}

    def __init__(self):
        self.n_layer = 3

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


_CONFIG = _MappedConfig()


def _scaled_by_the_config(x):
    return x * _CONFIG.num_hidden_layers + _CONFIG.n_layer


def test_a_config_attribute_map_as_eager():
    _assert_bit_identical(_scaled_by_the_config, torch.randn(3, requires_grad=True))


def test_stock_thunder_fails_on_a_config_attribute_map():
    with pytest.raises(AttributeError, match="num_hidden_layers"):
        thunder.jit(_scaled_by_the_config)(torch.randn(3))


class _RelativeBiasAttention(torch.nn.Module):
    """Attention whose additive mask is computed from parameters: a bias table indexed by a buffer (Swin's
    ``relative_position_bias_table``) or an embedding of bucketed distances (T5's ``relative_attention_bias``)."""

    def __init__(self, embedding: bool):
        super().__init__()
        self.embedding = embedding
        self.table = torch.nn.Parameter(torch.randn(7, 2))
        self.bias = torch.nn.Embedding(7, 2)
        self.register_buffer("index", torch.randint(0, 7, (16,)))

    def forward(self, q, k, v):
        if self.embedding:  # T5: buckets from the positions' distances, through an Embedding
            distance = torch.arange(4)[None, :] - torch.arange(4)[:, None]
            buckets = torch.where(distance.abs() < 2, distance.abs(), 2 + torch.log(distance.abs().float()).to(
                torch.long)) + 3 * (distance > 0).to(torch.long)
            mask = self.bias(buckets).permute(2, 0, 1).unsqueeze(0)
        else:  # Swin
            mask = self.table[self.index].view(4, 4, 2).permute(2, 0, 1).contiguous().unsqueeze(0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("embedding", [False, True], ids=["indexed_table", "embedding"])
def test_an_attention_mask_computed_from_parameters_gets_its_gradient(embedding):
    """eager runs SDPA's math kernel when the mask requires grad and differentiates the mask; the flash kernel
    gives it none. A mask computed in the trace has ``requires_grad=False`` on its proxy (thunder sets it on
    inputs only), so the flash kernel was taken and the bias parameters got no gradient, silently."""
    torch.manual_seed(0)
    module = _RelativeBiasAttention(embedding)
    q, k, v = (torch.randn(3, 2, 4, 4, requires_grad=True) for _ in range(3))
    expected = module(q, k, v)
    parameter = module.bias.weight if embedding else module.table
    expected_grads = torch.autograd.grad((expected * expected).sum(), [parameter, q, k, v])
    actual = thunder.jit(module, executors=thunderplug.discover())(q, k, v)
    assert torch.equal(actual, expected)
    parameter.grad = None
    ((actual * actual).sum()).backward()
    assert parameter.grad is not None and torch.equal(parameter.grad, expected_grads[0])
    assert all(torch.equal(t.grad, e) for t, e in zip((q, k, v), expected_grads[1:], strict=True))


def _normalized_top_k(scores):
    """Mixtral's router: the top-k weights divided in place by their sum."""
    weights, _ = torch.topk(scores.softmax(dim=-1), 2, dim=-1)
    weights /= weights.sum(dim=-1, keepdim=True)
    return weights


def test_an_in_place_division_by_its_own_sum_as_eager():
    """``copy_`` writes the quotient into the memory of the dividend, which the division's gradient reads: the
    backward divided the quotient (a wrong router gradient, silently; stock thunder too). Eager saves the
    original; the ``copy_`` now writes into a copy."""
    torch.manual_seed(0)
    _assert_bit_identical(_normalized_top_k, torch.randn(6, 4, requires_grad=True))


class _CrossAttentionBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, h, memory):
        scores = torch.softmax(self.q(h) @ self.k(memory).transpose(-1, -2), dim=-1)
        return h + scores @ self.v(memory)


class _EncoderDecoder(torch.nn.Module):
    """Repeated blocks that all read one tensor requiring grad (BART's encoder output, read by each decoder
    layer's keys and values), made after a dropout of probability ``p``."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p
        self.encoder = torch.nn.Linear(16, 16)
        self.blocks = torch.nn.ModuleList(_CrossAttentionBlock() for _ in range(3))

    def forward(self, x, y):
        memory = F.dropout(self.encoder(x), self.p, self.p > 0)
        for block in self.blocks:
            y = block(y, memory)
        return y


def test_blocks_sharing_a_tensor_that_requires_grad_as_eager():
    """Each block as a region of its own returned the sum of its uses' gradients, which autograd then added
    up: eager adds them use by use, so the encoder's gradients were ulps apart. Such a model runs as one
    trace."""
    torch.manual_seed(0)
    eager_model = _EncoderDecoder()
    model = _EncoderDecoder()
    model.load_state_dict(eager_model.state_dict())
    x, y = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    jitted = thunder.jit(model, executors=thunderplug.discover())
    for _ in range(2):
        cotangent = torch.randn(2, 8, 16)
        expected = eager_model(x, y)
        expected.backward(cotangent)
        actual = jitted(x, y)
        actual.backward(cotangent)
        assert torch.equal(actual, expected)
        for (name, p), e in zip(model.named_parameters(), eager_model.parameters(), strict=True):
            assert torch.equal(p.grad, e.grad), name


def test_blocks_sharing_a_tensor_draw_random_numbers_once():
    """The call that finds the shared tensor ran the model's code up to the second block: the random numbers
    that part drew are drawn again by the one trace, from the same generator state."""
    from thunderplug.caching import regions

    x, y = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    states = []
    for options in ({}, {regions.OPTION: False}):
        torch.manual_seed(0)
        jitted = thunder.jit(_EncoderDecoder(p=0.5), executors=thunderplug.discover(), **options)
        torch.manual_seed(1)
        jitted(x, y)
        states.append(torch.get_rng_state())
    assert torch.equal(states[0], states[1])


class _TiedEmbeddings(torch.nn.Module):
    """T5's tie: the encoder's and decoder's embeddings and the LM head are one tensor under three names."""

    def __init__(self):
        super().__init__()
        self.decoder_embed = torch.nn.Embedding(64, 16)
        self.encoder_embed = torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, 64, bias=False)
        self.encoder_embed.weight = self.head.weight = self.decoder_embed.weight

    def forward(self, x, y):
        memory = self.encoder_embed(x).tanh().sum(1, keepdim=True)
        logits = self.head(self.decoder_embed(y) + memory)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def test_a_tied_weight_gets_its_gradients_summed_in_eager_order():
    """eager sums the three uses' gradients as its backward computes them (head, decoder, encoder); thunder's
    Function returned one per input position and torch summed them by position (5.96e-8 apart; T5: 1.9e-9 at
    the first step, 5.7e-7 after three AdamW steps)."""
    torch.manual_seed(0)
    model = _TiedEmbeddings()
    x, y = torch.randint(0, 64, (4, 12)), torch.randint(0, 64, (4, 12))
    model(x, y).backward()
    expected = model.head.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    thunder.jit(model, executors=thunderplug.discover())(x, y).backward()
    assert torch.equal(model.head.weight.grad, expected)
