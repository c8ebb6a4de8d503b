"""torchao's QAT fake-quantized linears (``quantize_(model, QATConfig(..., step="prepare"))``) under discover().

Two thunder limits met them: the prologue cannot write the program's read of ``_DTYPE_TO_BIT_WIDTH[torch.int4]``
through a submodule's globals (``NotImplementedError: Exception occured unpacking object``; the function then runs
through Dynamo, whose guards check the read: wiring.fixes.unreadable_inputs_break), and the fake quantizer changes
a shape list after passing it to ``view`` (wiring.fixes.symbol_arguments_as_called, tests/test_symbol_arguments.py).
"""

import pytest
import thunder
import torch
from thunder.core.transform_common import Transform
from torch import nn
from train_like_eager import random_inputs, train_like_eager

import thunderplug

pytest.importorskip("torchao.quantization.qat")
from torchao.quantization import quantize_  # noqa: E402
from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig  # noqa: E402
from torchao.quantization.qat.fake_quantizer import IntxFakeQuantizer  # noqa: E402


def _qat_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    activations = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
    quantize_(model, QATConfig(activation_config=activations,
                               weight_config=IntxFakeQuantizeConfig(torch.int4, group_size=16), step="prepare"))
    return model


def test_qat_fake_quantized_linears_train_as_eager():
    with pytest.warns(thunderplug.ThunderplugWarning, match=r"a value the program read \(constant of .*int4\)"):
        train_like_eager(_qat_model(), random_inputs(4, 32), check_rng=True)


def test_where_the_graph_cannot_break_thunders_error_stands():
    jitted = thunder.jit(_qat_model(), executors=thunderplug.discover(), transforms=[Transform()])
    with pytest.raises(NotImplementedError, match="Exception occured unpacking object"):
        jitted(torch.randn(4, 32))


def test_a_weight_fake_quantizer_alone_runs_as_eager_in_one_trace():
    """Jitted alone, the quantizer needs no graph break; it failed on the changed shape list before
    (``RuntimeError: shape '[4, 2, 1]' is invalid for input of size 128``)."""
    quantizer = IntxFakeQuantizer(IntxFakeQuantizeConfig(torch.int4, group_size=16))
    x = torch.randn(4, 32, requires_grad=True)
    jitted = thunder.jit(quantizer, executors=thunderplug.discover())
    out, expected = jitted(x), quantizer(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    grad = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, x, grad), torch.autograd.grad(expected, x, grad), rtol=0,
                               atol=0)
    assert thunder.last_traces(jitted)
