"""thunderfx (torch.compile with thunder's ThunderCompiler) on tensor-subclass inputs, against eager."""

import torch
from thunder.dynamo import ThunderCompiler
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug


def test_twotensor_function_through_thunderfx_equals_eager():
    def fn(x, y):
        return (x * 2).sin() + y

    backend = ThunderCompiler(executors=thunderplug.discover(quiet=True))
    compiled = torch.compile(fn, backend=backend)
    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4)).requires_grad_()
    y = torch.randn(3, 4, requires_grad=True)
    out, expected = compiled(x, y), fn(x, y)
    assert type(out) is TwoTensor
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    grads = torch.autograd.grad(out, (x, y), torch.ones_like(expected))
    expected_grads = torch.autograd.grad(expected, (x, y), torch.ones_like(expected))
    torch.testing.assert_close(grads[0].a, expected_grads[0].a)
    torch.testing.assert_close(grads[0].b, expected_grads[0].b)
    torch.testing.assert_close(grads[1], expected_grads[1])


def test_plain_graphs_still_go_through_thunders_splitter():
    backend = ThunderCompiler(executors=thunderplug.discover(quiet=True))
    compiled = torch.compile(lambda x: x.cos() * 3, backend=backend)
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), x.cos() * 3)
    assert len(backend.subgraph_infos) == 1  # the splitter ran and recorded the graph
