"""The ``eager_kernels`` executor against eager PyTorch: every claimed op, forward and backward, in
float32 and float64, with contiguous and non-contiguous output gradients, compared **bit for bit**
(``torch.equal``): the executor's point is to run the very kernels eager's autograd runs.

Cases the executor declines (softmax with a dtype cast, probability targets, SDPA with a mask or
dropout) are checked to fall back to thunder's decomposition, still equal to eager within
``assert_close``'s defaults, and with no eager kernel in the trace. Cross-entropy with label
smoothing, declined too, meets the NLL-loss kernels in thunder's composition (tests/test_losses.py).
"""

from __future__ import annotations

import copy

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunderplug
from thunderplug_aten_ops import eager_kernels

DTYPES = [torch.float32, torch.float64]


def _executors(with_eager: bool = True) -> list:
    found = thunderplug.discover()
    return found if with_eager else [e for e in found if e.name != eager_kernels.EXECUTOR_NAME]


def _kernels_in(jitted) -> list[str]:
    traces = [thunder.last_traces(jitted)[-1]]
    backward = thunder.last_backward_traces(jitted)
    if backward:
        traces.append(backward[-1])
    return [b.sym.name for t in traces for b in t.bound_symbols if b.sym.name.startswith("eager_")]


def _cotangent(out: torch.Tensor, contiguous: bool) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if contiguous or out.ndim == 0:
        return torch.randn(out.shape, dtype=out.dtype, generator=generator)
    # same values layout-wise as a fresh tensor, but strided: a transposed copy viewed back
    flipped = torch.randn(tuple(reversed(out.shape)), dtype=out.dtype, generator=generator)
    g = flipped.permute(*reversed(range(out.ndim)))
    assert not g.is_contiguous() or out.ndim < 2
    return g


class Frozen:
    """An argument passed without ``requires_grad`` (eager refuses a gradient for it, e.g. a loss weight)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def _run(fn, args, *, contiguous_grad: bool, executors=None):
    """(eager outputs, eager grads, jitted outputs, jitted grads, jitted callable); every floating
    argument requires grad unless wrapped in :class:`Frozen`."""

    def fresh():
        return [
            a.tensor.clone() if isinstance(a, Frozen) else a.detach().clone().requires_grad_(a.is_floating_point())
            for a in args
        ]

    e_in, t_in = fresh(), fresh()
    jitted = thunder.jit(fn, executors=executors if executors is not None else _executors())
    e_out, t_out = fn(*e_in), jitted(*t_in)
    g = _cotangent(e_out, contiguous_grad)
    e_grads = torch.autograd.grad(e_out, [a for a in e_in if a.requires_grad], g)
    t_grads = torch.autograd.grad(t_out, [a for a in t_in if a.requires_grad], g)
    return e_out, e_grads, t_out, t_grads, jitted


def _gelu(x):
    return F.gelu(x)


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def _layer_norm_no_affine(x):
    return F.layer_norm(x, (x.shape[-2], x.shape[-1]))


def _softmax(x):
    return F.softmax(x, dim=-1)


def _softmax_dim1(x):
    return torch.softmax(x, 1)


def _log_softmax(x):
    return F.log_softmax(x, dim=-1)


def _cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


def _cross_entropy_sum_ignore(logits, target):
    return F.cross_entropy(logits, target, reduction="sum", ignore_index=3)


def _cross_entropy_none_weight(logits, target, weight):
    return F.cross_entropy(logits, target, weight=weight, reduction="none")


def _cross_entropy_mean_ignore(logits, target):
    return F.cross_entropy(logits, target, ignore_index=1)


def _nll_loss(logits, target):
    return F.nll_loss(F.log_softmax(logits, 1), target)


def _nll_loss_none_weight(logits, target, weight):
    return F.nll_loss(F.log_softmax(logits, 1), target, weight=weight, reduction="none")


def _sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _sdpa_scaled(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, scale=0.3)


def _conv2d(x, w, b):
    return F.conv2d(x, w, b, stride=2, padding=1)


def _conv1d_groups(x, w):
    return F.conv1d(x, w, None, padding=(2,), dilation=2, groups=2)


def _conv3d(x, w, b):
    return F.conv3d(x, w, b)


def _batch_norm(x, w, b):
    return F.batch_norm(x, None, None, w, b, training=True, eps=1e-3)


def _sdpa_bool_mask(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _causal_mask(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def _padding_mask(batch: int, n: int) -> torch.Tensor:
    """transformers' 4-D form: (batch, 1, queries, keys), the second sample's last 3 keys padded."""
    mask = _causal_mask(n).expand(batch, 1, n, n).clone()
    mask[1, :, :, n - 3 :] = False
    return mask


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as transformers 4 builds its additive one: the dtype's minimum where masked, else 0."""
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


def _sdpa_strided(q, k, v):
    # q/k/v as views of (b, t, h, d) projections, the way an attention block builds them
    split = lambda y: y.transpose(1, 2)  # noqa: E731
    return F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True).transpose(1, 2)


ND_CROSS_ENTROPY = [
    "eager_log_softmax", "eager_nll_loss2d_forward", "eager_nll_loss2d_backward", "eager_log_softmax_backward_data"
]


def _cases(dtype):
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, dtype=dtype, generator=g)  # noqa: E731
    target = torch.randint(0, 10, (24,), generator=g)
    qkv = [r(2, 3, 16, 8) for _ in range(3)]
    return {
        "gelu": (_gelu, [r(4, 16, 32)], ["eager_gelu", "eager_gelu_backward"]),
        "gelu_tanh": (_gelu_tanh, [r(4, 16, 32)], ["eager_gelu", "eager_gelu_backward"]),
        "layer_norm": (
            _layer_norm,
            [r(4, 16, 32), r(32), r(32)],
            ["eager_native_layer_norm", "eager_native_layer_norm_backward"],
        ),
        "layer_norm_no_affine": (
            _layer_norm_no_affine,
            [r(4, 16, 32)],
            ["eager_native_layer_norm", "eager_native_layer_norm_backward"],
        ),
        "softmax": (_softmax, [r(4, 16, 32)], ["eager_softmax", "eager_softmax_backward_data"]),
        "softmax_dim1": (_softmax_dim1, [r(4, 16, 32)], ["eager_softmax", "eager_softmax_backward_data"]),
        "log_softmax": (_log_softmax, [r(4, 16, 32)], ["eager_log_softmax", "eager_log_softmax_backward_data"]),
        "cross_entropy": (
            _cross_entropy,
            [r(24, 10), target],
            [
                "eager_log_softmax",
                "eager_nll_loss_forward",
                "eager_nll_loss_backward",
                "eager_log_softmax_backward_data",
            ],
        ),
        "cross_entropy_sum_ignore": (
            _cross_entropy_sum_ignore,
            [r(24, 10), target],
            [
                "eager_log_softmax",
                "eager_nll_loss_forward",
                "eager_nll_loss_backward",
                "eager_log_softmax_backward_data",
            ],
        ),
        "cross_entropy_none_weight": (
            _cross_entropy_none_weight,
            [r(24, 10), target, Frozen(r(10).abs())],
            [
                "eager_log_softmax",
                "eager_nll_loss_forward",
                "eager_nll_loss_backward",
                "eager_log_softmax_backward_data",
            ],
        ),
        # (n, c, d1, ...) inputs: ATen's nll_loss2d, on an (n, c, 1, -1) view unless 4-D
        "cross_entropy_3d": (_cross_entropy, [r(4, 10, 6), target.view(4, 6)], ND_CROSS_ENTROPY),
        "cross_entropy_4d_none_weight": (
            _cross_entropy_none_weight, [r(2, 10, 3, 4), target.view(2, 3, 4), Frozen(r(10).abs())], ND_CROSS_ENTROPY
        ),
        "cross_entropy_5d_sum_ignore": (
            _cross_entropy_sum_ignore, [r(2, 10, 2, 3, 2), target.view(2, 2, 3, 2)], ND_CROSS_ENTROPY
        ),
        "cross_entropy_3d_none_weight": (
            _cross_entropy_none_weight, [r(4, 10, 6), target.view(4, 6), Frozen(r(10).abs())], ND_CROSS_ENTROPY
        ),
        "cross_entropy_3d_mean_ignore": (
            _cross_entropy_mean_ignore, [r(3, 10, 8), target.view(3, 8)], ND_CROSS_ENTROPY
        ),
        # nll_loss itself (thunder's own backward is wrong for 3-D and 5-D inputs)
        "nll_loss": (
            _nll_loss,
            [r(24, 10), target],
            [
                "eager_log_softmax",
                "eager_nll_loss_forward",
                "eager_nll_loss_backward",
                "eager_log_softmax_backward_data",
            ],
        ),
        "nll_loss_3d_none_weight": (
            _nll_loss_none_weight, [r(4, 10, 6), target.view(4, 6), Frozen(r(10).abs())], ND_CROSS_ENTROPY
        ),
        "nll_loss_5d": (_nll_loss, [r(2, 10, 2, 3, 2), target.view(2, 2, 3, 2)], ND_CROSS_ENTROPY),
        "sdpa_causal": (_sdpa_causal, qkv, ["eager_sdpa_flash_cpu", "eager_sdpa_flash_cpu_backward"]),
        "sdpa_scaled": (_sdpa_scaled, qkv, ["eager_sdpa_flash_cpu", "eager_sdpa_flash_cpu_backward"]),
        "sdpa_strided": (
            _sdpa_strided,
            [r(2, 16, 3, 8) for _ in range(3)],
            ["eager_sdpa_flash_cpu", "eager_sdpa_flash_cpu_backward"],
        ),
        # convolutions (a ViT's patch embedding): ATen's convolution and convolution_backward
        "conv2d": (_conv2d, [r(2, 3, 9, 9), r(4, 3, 3, 3), r(4)], CONVOLUTION),
        "conv1d_groups": (_conv1d_groups, [r(2, 4, 11), r(6, 2, 3)], CONVOLUTION),
        "conv3d": (_conv3d, [r(1, 2, 4, 5, 5), r(3, 2, 2, 2, 2), r(3)], CONVOLUTION),
        # batch statistics without running ones (training, track_running_stats=False): native_batch_norm
        "batch_norm": (_batch_norm, [r(3, 4, 5, 5), r(4), r(4)], BATCH_NORM),
        # boolean masks (transformers' sdpa_mask): the kernel eager runs, fed the additive mask eager makes
        "sdpa_bool_mask": (_sdpa_bool_mask, [*qkv, Frozen(_causal_mask(16))], SDPA_WITH_MASK),
        "sdpa_padding_mask": (_sdpa_bool_mask, [*qkv, Frozen(_padding_mask(2, 16))], SDPA_WITH_MASK),
        # an additive mask without grad (transformers 4's padding masks): handed to the kernel as it is
        "sdpa_float_mask": (_sdpa_bool_mask, [*qkv, Frozen(_additive(_padding_mask(2, 16), dtype))], SDPA_WITH_MASK),
    }


CONVOLUTION = ["eager_convolution", "eager_convolution_backward"]
BATCH_NORM = ["eager_native_batch_norm", "eager_native_batch_norm_backward"]
#: the trace of SDPA with a boolean mask: the additive mask built as eager's sdpa builds it, then the kernels
SDPA_WITH_MASK = ["eager_sdpa_flash_cpu", "eager_sdpa_flash_cpu_backward"]

CASE_NAMES = list(_cases(torch.float32))


@pytest.mark.parametrize("contiguous_grad", [True, False], ids=["grad", "strided_grad"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASE_NAMES)
def test_bit_identical_to_eager(case, dtype, contiguous_grad):
    fn, args, kernels = _cases(dtype)[case]
    e_out, e_grads, t_out, t_grads, jitted = _run(fn, args, contiguous_grad=contiguous_grad)
    assert _kernels_in(jitted) == kernels
    assert t_out.dtype == e_out.dtype and t_out.shape == e_out.shape
    assert torch.equal(t_out, e_out)
    assert len(t_grads) == len(e_grads)
    for t, e in zip(t_grads, e_grads):
        assert torch.equal(t, e), f"gradient differs: max abs {(t - e).abs().max().item():.3g}"


#: case -> the operator the no-grad trace shows: thunder's symbol, as thunder's torch executor prints it
NO_GRAD_OPERATORS = {
    "gelu": ("gelu", "torch.nn.functional.gelu"),
    "layer_norm": ("layer_norm", "torch.nn.functional.layer_norm"),
    "softmax": ("softmax", "torch.softmax"),
    "log_softmax": ("log_softmax", "torch.nn.functional.log_softmax"),
    "cross_entropy": ("cross_entropy", "torch.nn.functional.cross_entropy"),
    "sdpa_causal": ("scaled_dot_product_attention", "torch.nn.functional.scaled_dot_product_attention"),
}


@pytest.mark.parametrize("case", list(NO_GRAD_OPERATORS))
def test_no_grad_keeps_thunders_symbol_run_by_the_executor(case):
    """Without grad the trace keeps thunder's symbol (thunder's own test of SDPA looks for
    ``scaled_dot_product_attention``; issue 23), taken by this executor (so no fuser decomposes it),
    and the values are eager's bit for bit."""
    fn, args, _ = _cases(torch.float32)[case]
    args = [a.tensor if isinstance(a, Frozen) else a.detach() for a in args]
    jitted = thunder.jit(fn, executors=_executors())
    expected = fn(*args)
    assert torch.equal(jitted(*args), expected)
    assert _kernels_in(jitted) == []
    trace = thunder.last_traces(jitted)[-1]
    name, printed = NO_GRAD_OPERATORS[case]
    [op] = [b for b in trace.bound_symbols if b.sym.id == name]
    assert op.sym.executor.name == eager_kernels.EXECUTOR_NAME
    assert [sub.sym for sub in op.subsymbols] == [_thunder_symbol(case)]
    assert f"{printed}(" in str(trace)


@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batch_norm_module_as_eager(dtype, training):
    """A BatchNorm2d after a convolution, three steps with grad: outputs, the gradients of the input, weight and
    bias, and the running statistics and step counter (updated in training, as ATen's kernel updates them: the
    functional kernel's new statistics copied into the buffers) bit for bit; thunder's own decomposition drifts
    (a torchvision MobileNetV2 of batch 2 at 1x1 in its last stages: 1.6e3 relative at the first step)."""
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).to(dtype).train(training)
    module = copy.deepcopy(eager)
    jitted = thunder.jit(module, executors=_executors())
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(2, 3, 6, 6, dtype=dtype, generator=generator).requires_grad_()
        x_eager = x.detach().clone().requires_grad_()
        out, expected = jitted(x), eager(x_eager)
        g = torch.randn(out.shape, dtype=dtype, generator=generator)
        out.backward(g)
        expected.backward(g)
        assert torch.equal(out, expected) and torch.equal(x.grad, x_eager.grad)
    for (name, p), (_, q) in zip(module.named_parameters(), eager.named_parameters()):
        assert torch.equal(p.grad, q.grad), name
    for (name, b), (_, e) in zip(module.named_buffers(), eager.named_buffers()):
        assert torch.equal(b, e), name
    kernels = _kernels_in(jitted)
    assert ("eager_native_batch_norm_functional" if training else "eager_native_batch_norm") in kernels, kernels
    assert "eager_native_batch_norm_backward" in kernels, kernels


def _masks_in_backward(jitted) -> dict[str, list]:
    backward = thunder.last_backward_traces(jitted)[-1]
    return {b.sym.name: b.args[-1] for b in backward.bound_symbols if b.sym.name.endswith("_backward")}


def test_backward_kernels_compute_only_the_gradients_eager_asks_for():
    """A network's first convolution (its input requires no grad) and a frozen LayerNorm: eager's autograd asks
    the backward kernels for the gradients of the tensors requiring grad only (``output_mask``); so do the traces,
    and the gradients are eager's bit for bit."""
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.LayerNorm(4))
    eager[2].requires_grad_(False)
    module = copy.deepcopy(eager)
    jitted = thunder.jit(module, executors=_executors())
    x = torch.randn(2, 3, 6, 6)
    jitted(x).sum().backward()
    eager(x).sum().backward()
    for (name, p), (_, q) in zip(module.named_parameters(), eager.named_parameters()):
        assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad), name
    masks = _masks_in_backward(jitted)
    assert masks["eager_convolution_backward"] == [False, True, True], masks
    assert masks["eager_native_layer_norm_backward"] == [True, False, False], masks


def _thunder_symbol(case: str):
    import thunder.torch as ltorch

    from thunderplug.thunder_compat import ltorch_private

    return {
        "gelu": ltorch.gelu,
        "layer_norm": ltorch.layer_norm,
        "softmax": ltorch_private("_softmax"),
        "log_softmax": ltorch.log_softmax,
        "cross_entropy": ltorch.cross_entropy,
        "sdpa_causal": ltorch.scaled_dot_product_attention,
    }[case]


def test_thunders_decomposition_differs_without_the_executor():
    """What the executor fixes (issue 12 item 6): thunder's own GELU gradient is not eager's."""
    x = torch.randn(1024, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    # eager_backward_kernels would take ops of thunder's GELU decomposition: leave both out
    executors = thunderplug.discover(exclude=[eager_kernels.EXECUTOR_NAME, "eager_backward_kernels"])
    e_out, e_grads, t_out, t_grads, jitted = _run(_gelu, [x], contiguous_grad=True, executors=executors)
    assert _kernels_in(jitted) == []
    torch.testing.assert_close(t_grads[0], e_grads[0])
    assert not torch.equal(t_grads[0], e_grads[0]) or not torch.equal(t_out, e_out)


def _softmax_cast(x):
    return F.softmax(x, dim=-1, dtype=torch.float64)


def _cross_entropy_probabilities(logits, target):
    return F.cross_entropy(logits, target)


def _sdpa_mask(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize(
    "fn, make, not_claimed",
    [
        (_softmax_cast, lambda r: [r(4, 8).float()], "eager_softmax"),
        (_cross_entropy_probabilities, lambda r: [r(12, 5), Frozen(r(12, 5).softmax(-1))], "eager_nll"),
        # a mask requiring grad: never the flash kernel (its backward gives the mask none); eager's math composite
        (_sdpa_mask, lambda r: [r(2, 3, 8, 4), r(2, 3, 8, 4), r(2, 3, 8, 4), r(8, 8)], "eager_sdpa_flash"),
    ],
    ids=["softmax_dtype", "probability_targets", "sdpa_mask"],
)
def test_declined_cases_stay_thunders_and_match_eager(fn, make, not_claimed):
    torch.manual_seed(0)
    args = make(lambda *shape: torch.randn(*shape, dtype=torch.float64))
    e_out, e_grads, t_out, t_grads, jitted = _run(fn, args, contiguous_grad=True)
    assert not any(k.startswith(not_claimed) for k in _kernels_in(jitted)), _kernels_in(jitted)
    torch.testing.assert_close(t_out, e_out)
    for t, e in zip(t_grads, e_grads):
        torch.testing.assert_close(t, e)


def test_executor_is_in_discover_before_the_fusers_and_can_be_excluded():
    names = [e.name for e in _executors()]
    assert eager_kernels.EXECUTOR_NAME in names
    assert names.index(eager_kernels.EXECUTOR_NAME) < names.index("aten")
    found = thunderplug.discover(exclude=[eager_kernels.EXECUTOR_NAME])
    assert eager_kernels.EXECUTOR_NAME not in [e.name for e in found]
