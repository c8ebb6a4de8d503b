"""Every patch of thunder (the table in wiring.patches): installed, undone, inert without
discover(), effective with it."""

import collections
import contextlib
import copy
import dataclasses
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import thunder
import torch
from thunder.core import jit_ext
from thunder.core.codeutils import SigInfo
from thunder.core.symbol import Symbol
from thunder.torch.experimental import dtensor_proxy
from torch.testing._internal.two_tensor import TwoTensor

import thunderplug
from thunderplug.eager import tensor_api
from thunderplug.wiring import patches

ROOT = Path(__file__).resolve().parents[1]


def _current(patch):
    value = patch.read()
    return value.__func__ if isinstance(value, staticmethod) else value


def test_patches_are_installed_once_by_discover():
    thunderplug.discover()
    assert patches.is_installed()
    installed = {patch.name: _current(patch) for patch in patches.PATCHES}
    patches.install()
    assert {patch.name: _current(patch) for patch in patches.PATCHES} == installed
    assert dtensor_proxy.proxify_dtensor is installed["proxify"]
    assert Symbol.__call__ is installed["Symbol.__call__"]
    assert jit_ext._general_jit_lookaside_map[isinstance] is installed["isinstance lookaside"]
    assert SigInfo.from_name_and_args is installed["SigInfo.from_name_and_args"]


def test_uninstall_restores_thunder_exactly():
    thunderplug.discover()
    patched = {patch.name: _current(patch) for patch in patches.PATCHES}
    patches.uninstall()
    try:
        restored = {patch.name: _current(patch) for patch in patches.PATCHES}
        assert all(restored[name] is not patched[name] for name in patched)
        assert Symbol.__call__.__module__ == "thunder.core.symbol"
        assert dtensor_proxy.proxify_dtensor.__module__.startswith("thunder.")
        assert type.__call__ not in jit_ext._general_jit_lookaside_map  # thunder had no entry there

        def fn(x):
            return isinstance(x, TwoTensor), x * 2

        jitted = thunder.jit(fn)
        is_two_tensor, _ = jitted(TwoTensor(torch.randn(2), torch.randn(2)))
        assert is_two_tensor is False and "check_not_subclass" not in str(thunder.last_traces(jitted)[0])
    finally:
        patches.install()
    assert {patch.name: _current(patch) for patch in patches.PATCHES}.keys() == patched.keys()


def test_installed_context_manager_restores_what_it_installed():
    thunderplug.discover()
    patches.uninstall()
    try:
        with patches.installed():
            assert patches.is_installed()
        assert not patches.is_installed()
    finally:
        patches.install()


def test_docs_patches_md_is_what_the_table_generates():
    assert (ROOT / "docs" / "patches.md").read_text() == patches.markdown()


def test_plain_thunder_jit_keeps_thunder_behaviour():
    thunderplug.discover()

    def fn(x):
        return isinstance(x, TwoTensor), x * 2

    jitted = thunder.jit(fn)
    is_two_tensor, _ = jitted(TwoTensor(torch.randn(2), torch.randn(2)))
    assert is_two_tensor is False  # thunder 0.2.6 erases the subclass; we do not change that
    assert '"TwoTensor[' not in str(thunder.last_traces(jitted)[0])


def test_autograd_function_with_a_config_argument():
    """thunder 0.2.6 alone fails with "... has no attribute 'name'" on such an argument."""

    @dataclasses.dataclass
    class Config:
        factor: float

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, config):
            ctx.factor = config.factor
            return x * config.factor

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.factor, None

    thunderplug.discover()
    x = torch.randn(3, requires_grad=True)
    out = thunder.jit(lambda x: Scale.apply(x, Config(3.0)))(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0))


def test_recording_restores_thunder_jit():
    original = thunder.jit
    with patches.recording_jitted_functions() as recorded:
        thunder.jit(lambda x: x + 1)
    assert thunder.jit is original and len(recorded) == 1


def test_explain_cli_runs_a_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, thunder, thunderplug\n"
        "from torch.testing._internal.two_tensor import TwoTensor\n"
        "f = thunder.jit(lambda x: (x * 2).sin(), executors=thunderplug.discover())\n"
        "f(TwoTensor(torch.randn(3), torch.randn(3)))\n"
    )
    command = [sys.executable, "-m", "thunderplug", "explain", "--all", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "TwoTensor.torch.mul" in result.stdout and "before autodiff" in result.stdout
    assert "aten_sin_default" in result.stdout


NON_DIFFERENTIABLE_PROGRAM = """
import torch, thunder
def fwd(ctx, x, y):
    return (x * y, x + y), (x, y)
def bwd(ctx, g0, g1, x, y):
    return g0 * y + g1, g0 * x + g1
def f(x, y):
    a, b = torch.ops.higher_order.autograd_function_apply(
        fwd, bwd, x, y, args_tensor_mask=[True, True], non_differentiable_idx=[1])
    return (a + b * 2).sum()
torch.manual_seed(0)
x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
expected = torch.autograd.grad(f(x, y), (x, y))
"""


def test_non_differentiable_idx_is_honoured():
    namespace: dict = {}
    exec(NON_DIFFERENTIABLE_PROGRAM, namespace)  # noqa: S102 - the test's own program text
    f, x, y, expected = (namespace[k] for k in ("f", "x", "y", "expected"))
    actual = torch.autograd.grad(thunder.jit(f, executors=thunderplug.discover())(x, y), (x, y))
    torch.testing.assert_close(actual, expected)


def test_stock_thunder_ignores_non_differentiable_idx():
    """The reason for the patch: in a process without thunderplug the same program is wrong."""
    check = NON_DIFFERENTIABLE_PROGRAM + (
        "actual = torch.autograd.grad(thunder.jit(f)(x, y), (x, y))\n"
        "print(max((a - e).abs().max().item() for a, e in zip(actual, expected)))\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.split()[-1]) > 1.0


def test_full_gcs_are_deferred_while_a_discover_compilation_runs_and_restored_after():
    """Only discover() compilations defer full collections; the thresholds are restored, also
    after a compilation that fails; young collections keep running."""
    import gc

    from thunderplug.wiring import speedups

    seen = []

    def probe(x):
        seen.append(gc.get_threshold())
        return x

    thunderplug.discover()
    before = gc.get_threshold()
    x = torch.randn(3)
    jitted = thunder.jit(lambda x: probe(x) * 2, executors=thunderplug.discover())
    torch.testing.assert_close(jitted(x), x * 2)
    plain = thunder.jit(lambda x: probe(x) * 3)
    torch.testing.assert_close(plain(x), x * 3)
    assert seen == [(before[0], before[1], speedups._NO_FULL_COLLECTION), before]  # probe runs while tracing
    assert gc.get_threshold() == before and gc.isenabled()

    def fails(x):
        raise ValueError("in the user's code")

    with pytest.raises(ValueError, match="user's code"):
        thunder.jit(fails, executors=thunderplug.discover())(x)
    assert gc.get_threshold() == before
    with speedups._gc_lock:
        assert speedups._gc_state == {"depth": 0, "threshold": None}


def test_dce_pruning_keeps_what_thunders_keeps():
    """The replacement of ``_remove_noop_subsymbols`` prunes the same subsymbols as thunder's own
    on a traced program with nested composites (inside a discover() compilation)."""
    import copy as copy_module

    from thunder.core.compile_data import compile_data_and_stats
    from thunder.core.transform_common import dce

    thunderplug.discover()
    original, _ = patches._originals["dce subsymbol pruning"]
    jitted = thunder.jit(
        lambda x, w: torch.nn.functional.gelu(torch.nn.functional.linear(x, w)).softmax(-1),
        executors=thunderplug.discover(),
    )
    jitted(torch.randn(4, 3), torch.randn(5, 3))
    trace = thunder.last_traces(jitted)[0]

    def shape(bsyms):
        return [(b.sym.name, shape(b.subsymbols)) for b in bsyms]

    theirs = copy_module.deepcopy(trace.bound_symbols)
    for bsym in theirs:
        original(bsym)
    with compile_data_and_stats(thunder.compile_data(jitted), thunder.compile_stats(jitted)):
        ours = dce(trace).bound_symbols
    assert shape(ours) == shape([b for b in theirs if b.sym.name in {o.sym.name for o in ours}])
    assert any(b.subsymbols for b in ours)
def _scale(t, factor):
    return t * factor


def _tensor_methods(x, w):
    y = x.t().transpose(0, 1).reshape(-1, 2).add(w.reshape(-1, 2), alpha=2)  # symbols, DTensor wrappers, keywords
    scaled = functools.partial(_scale, factor=3.0)(y.exp())  # a partial with keywords: interpreted as before
    return scaled.sum()


def _trace_without_comments(trace) -> str:
    return "\n".join(line for line in str(trace).splitlines() if line.strip() and not line.strip().startswith("#"))


def test_tensor_method_calls_trace_what_interpretation_traces():
    """Method calls on proxies skip interpreting ``functools.partial``: the same traces (up to
    source comments) and eager's values and gradients; the user's line is recorded for
    ``x.transpose`` (interpreted, thunder named its own DTensor wrapper)."""
    thunderplug.discover()
    patch = next(p for p in patches.PATCHES if p.name == "tensor method calls")
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    expected = _tensor_methods(x, w)
    expected_grads = torch.autograd.grad(expected, (x, w))

    def compiled():
        jitted = thunder.jit(_tensor_methods, executors=thunderplug.discover())
        result = jitted(x, w)
        torch.testing.assert_close(result, expected, rtol=0, atol=0)
        for got, want in zip(torch.autograd.grad(result, (x, w)), expected_grads):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        return [str(t) for t in thunder.last_traces(jitted)], [str(t) for t in thunder.last_backward_traces(jitted)]

    fast = compiled()
    with _standing_in(*_thunders_own(patch)):
        interpreted = compiled()
    assert [_trace_without_comments(t) for t in fast[0] + fast[1]] == [
        _trace_without_comments(t) for t in interpreted[0] + interpreted[1]
    ]
    assert "dtensor_torch_and_prims.py" in fast[0][0] or "dtensor_torch_and_prims.py" in interpreted[0][0]
    assert "dtensor_torch_and_prims.py" not in fast[0][0] and "test_patches.py" in fast[0][0]


class _Builtins(torch.nn.Module):
    """Module attribute reads (``nn.Module.__getattr__``: ``in`` on its dicts) and builtins."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 3)
        self.register_buffer("offset", torch.arange(3.0))
        self.steps = [1, 2]
        self.activation = "tanh"

    def forward(self, x):
        y = self.inner(x) + self.offset
        if hasattr(self.inner, "bias") and isinstance(y, torch.Tensor) and "inner" in self._modules:
            y = y * len(self.steps) + min(self.steps) + sum(abs(s) for s in range(-2, 1))
        try:
            y = y + undefined_name  # noqa: F821 - the NameError path: looked up as before
        except NameError:
            y = y - 1
        return getattr(torch, self.activation)(y).sum()


def _compiled_traces(module, x, *others):
    """Value, gradients (of ``x`` and the parameters) and traces of ``module(x, *others)`` jitted."""
    jitted = thunder.jit(module, executors=thunderplug.discover())
    result = jitted(x, *others)
    grads = torch.autograd.grad(result, [x, *module.parameters()])
    traces = [*thunder.last_prologue_traces(jitted), *thunder.last_traces(jitted)]
    traces += thunder.last_backward_traces(jitted)
    return result, grads, [_trace_without_comments(t) for t in traces]


@contextlib.contextmanager
def _standing_in(*pairs):
    """For the block, each ``(patch, function)`` pair's function in place of the patch's replacement."""
    replacements = [patch.read() for patch, _ in pairs]
    try:
        for patch, function in pairs:
            patch.write(function)
        yield
    finally:
        for (patch, _), replacement in zip(pairs, replacements):
            patch.write(replacement)


def _thunders_own(*chosen):
    """:func:`_standing_in` pairs putting thunder's originals back in place of the chosen patches'."""
    return [(patch, patches._originals[patch.name][0]) for patch in chosen]


def _traces_with_thunders_own(patch_or_patches, module, x, *others):
    """:func:`_compiled_traces` with thunder's originals in place of the patches' replacements."""
    chosen = patch_or_patches if isinstance(patch_or_patches, list) else [patch_or_patches]
    with _standing_in(*_thunders_own(*chosen)):
        return _compiled_traces(module, x, *others)


def _assert_same_compilation(traces, others):
    """Equal values and gradients (bit for bit) and equal traces (up to comments)."""
    torch.testing.assert_close(traces[:2], others[:2], rtol=0, atol=0)
    assert traces[2] == others[2]


def test_builtins_lookups_trace_what_interpretation_traces():
    """Builtins found without interpreting their subscripts: the same prologue, forward and backward
    traces (up to comments) and the same values and gradients (eager's); only a name that is not a builtin (and
    module globals) reach thunder's own lookup."""
    from thunder.core.interpreter import unwrap

    from thunderplug.subclass.executor import active_core_executor
    from thunderplug.wiring import speedups

    thunderplug.discover()
    torch.manual_seed(0)
    module, x = _Builtins(), torch.randn(2, 4, requires_grad=True)
    expected = module(x)
    expected_grads = torch.autograd.grad(expected, [x, *module.parameters()])
    patch = next(p for p in patches.PATCHES if p.name == "builtins lookups")
    original = patches._originals[patch.name][0]
    asked: list[str] = []

    def counted(globals_dict, name):
        if unwrap(name) not in unwrap(globals_dict):
            asked.append(unwrap(name))
        return original(globals_dict, name)

    fast_one = speedups.builtins_without_interpretation(counted, lambda: active_core_executor() is not None)
    with _standing_in((patch, fast_one)):
        fast = _compiled_traces(module, x)
    interpreted = _traces_with_thunders_own(patch, module, x)
    assert asked == ["undefined_name"]
    torch.testing.assert_close(fast[0], expected)
    for got, want in zip(fast[1], expected_grads):
        torch.testing.assert_close(got, want)
    _assert_same_compilation(fast, interpreted)
    assert "offset" in fast[2][0]  # the prologue unpacks the buffer through the module's dicts


class _Containers(torch.nn.Module):
    """``bool``, ``len``, ``in`` and subscripts of builtin containers: module attributes (a dict of
    tensors, an OrderedDict, a tuple, a list, sets, a string, None), arguments (a list of tensors, a
    dict of numbers) and a dict made and changed in forward; the KeyError and IndexError paths."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.scales = {"a": torch.tensor(2.0), "b": torch.tensor(3.0)}
        self.order = collections.OrderedDict(first=1, second=2)
        self.names = ("a", "b")
        self.sizes = [1, 2, 3]
        self.tags = frozenset({"x"})
        self.empty: dict = {}
        self.label = "block"
        self.nothing = None

    def forward(self, x, pieces, options):
        y = self.linear(x)
        if self.scales and "a" in self.scales and "z" not in self.scales:
            y = y * self.scales["a"] + len(self.scales)
        if not self.empty and not self.nothing and self.label and len(self.names) == 2:
            y = y + len(self.label) + self.sizes[-1] + sum(self.sizes[1:])
        if self.order and "second" in self.order and "x" in self.tags and "y" not in {"z"}:
            y = y * self.order["second"] + self.names.index(self.names[1])
        made = {"k": y}
        made["j"] = y * 2
        if len(made) == 2 and "j" in made and made:
            y = made["j"] - made["k"]
        if pieces and len(pieces) == 2:
            y = y + pieces[0] * pieces[-1]
        if options["scale"] and "shift" in options and not 0.0:
            y = y * options["scale"] + options["shift"]
        try:
            y = y + self.scales["missing"]
        except KeyError:
            y = y - 1
        try:
            y = y + self.sizes[5]
        except IndexError:
            y = y + 1
        return y.sum()


def test_builtin_containers_read_without_interpreting_helpers():
    """``bool``/``len``/``in``/subscripts of builtin containers called on their own methods: eager's
    values and gradients, the same prologue, forward and backward traces as thunder's own helpers
    (the prologue checks the same items), and no builtin container reaching those helpers."""
    from thunder.core.interpreter import unwrap

    from thunderplug.subclass.executor import active_core_executor
    from thunderplug.wiring import speedups

    thunderplug.discover()
    torch.manual_seed(0)
    module, x = _Containers(), torch.randn(2, 4, requires_grad=True)
    others = ([torch.randn(4), torch.randn(4)], {"scale": 3, "shift": 0.5})
    expected = module(x, *others)
    expected_grads = torch.autograd.grad(expected, [x, *module.parameters()])
    chosen = [p for p in patches.PATCHES if p.name.startswith(("bool()", "len()", "in of", "subscripts of"))]
    assert len(chosen) == 4
    reached: list[type] = []  # types that reached thunder's helpers
    handled = [0]

    def active():
        handled[0] += 1
        return active_core_executor() is not None

    def sized(builtin):
        original = patches._originals[f"{builtin.__name__}() of builtin values"][0]

        def counted(value):
            reached.append(type(unwrap(value)))
            return original(value)

        return speedups.container_sizes_without_interpretation(builtin, counted, active)

    def handler(name, make, depth):
        original = patches._originals[name][0]

        def counted(inst, **state):
            reached.append(type(unwrap(state["stack"]._stack[-depth])))
            return original(inst, **state)

        return make(counted, active)

    fast_ones = [
        sized(bool),
        sized(len),
        handler("in of dicts and sets", speedups.membership_tests_without_interpretation, 1),
        handler("subscripts of dicts, lists, tuples", speedups.subscripts_without_interpretation, 2),
    ]
    with _standing_in(*zip(chosen, fast_ones)):
        fast = _compiled_traces(module, x, *others)
    interpreted = _traces_with_thunders_own(chosen, module, x, *others)
    covered = {dict, collections.OrderedDict, list, tuple, set, frozenset, str, type(None), int, float}
    assert handled[0] > 20 and not covered & set(reached), reached
    torch.testing.assert_close(fast[0], expected)
    for got, want in zip(fast[1], expected_grads):
        torch.testing.assert_close(got, want)
    _assert_same_compilation(fast, interpreted)


class _ModuleCalls(torch.nn.Module):
    """Submodules called plainly, with keywords, with hooks of their own, and with a ``forward``
    replaced on the instance."""

    def __init__(self):
        super().__init__()
        self.plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
        self.hooked = torch.nn.Linear(4, 4)
        self.hooked.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
        self.hooked.register_forward_hook(lambda module, args, out: out + 1)
        self.replaced = torch.nn.Linear(4, 4)
        self.replaced.forward = lambda x: torch.nn.functional.linear(x, self.replaced.weight, self.replaced.bias) * 3

    def forward(self, x):
        return (self.plain(input=x) + self.hooked(x) + self.replaced(x)).sum()


@pytest.mark.parametrize("global_hook", [False, True], ids=["module-hooks", "global-hook"])
def test_module_calls_without_hook_checks_trace_what_interpretation_traces(global_hook):
    """A module call with no hooks interprets its ``forward`` directly; a module with hooks, or every
    module while a global hook is registered, is interpreted as torch's ``__call__``: eager's values and
    gradients (the hooks ran), and the same traces as with thunder interpreting every call."""
    from thunderplug.wiring import speedups

    thunderplug.discover()
    torch.manual_seed(0)
    module, x = _ModuleCalls(), torch.randn(2, 4, requires_grad=True)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: out) if global_hook else None
    try:
        expected = module(x)
        expected_grads = torch.autograd.grad(expected, [x, *module.parameters()])
        patch = next(p for p in patches.PATCHES if p.name == "module calls without hook checks")
        direct: list[str] = []

        checked = speedups._calls_forward_only

        def recorded(candidate):
            answer = checked(candidate)
            if answer:
                direct.append(type(candidate).__name__)
            return answer

        try:
            speedups._calls_forward_only = recorded
            with _standing_in((patch, speedups.module_calls_without_hook_checks(None))):
                fast = _compiled_traces(module, x)
        finally:
            speedups._calls_forward_only = checked
        interpreted = _traces_with_thunders_own(patch, module, x)
    finally:
        if handle is not None:
            handle.remove()
    called_directly = ["Linear", "Linear", "Sequential", "Tanh", "_ModuleCalls"]  # all but `hooked`
    assert sorted(direct) == ([] if global_hook else called_directly)
    torch.testing.assert_close(fast[0], expected)
    for got, want in zip(fast[1], expected_grads):
        torch.testing.assert_close(got, want)
    _assert_same_compilation(fast, interpreted)


class _RegistersHooks(torch.nn.Module):
    """Reads submodules and registers a hook while traced: stock thunder's prologue then checks torch's
    hook counter, reached through the globals of ``nn.Module.__call__``."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.inner.register_forward_hook(lambda module, args, out: out * 2)
        return self.inner(x).sum()


@pytest.mark.parametrize("module_class", [_Builtins, _RegistersHooks])
def test_stock_compilations_do_not_see_discover_only_lookasides(module_class):
    """Outside discover() compilations thunder finds no lookaside for the functions it interprets that
    the table gives one (its own answer for them): stock ``thunder.jit`` with the patches installed
    traces what it traces without them (prologue included) and fails where it fails."""
    from thunder.core import interpreter

    thunderplug.discover()
    for fn in patches._DISCOVER_ONLY_LOOKASIDES:  # thunder's lookup has no answer for them but the table's
        assert fn in jit_ext._general_jit_lookaside_map
        assert not interpreter.is_opaque(fn) or fn in tensor_api.UNSUPPORTED_DATA_DEPENDENT  # builtins thunder lacks
        assert fn not in interpreter._default_lookaside_map
        assert fn not in interpreter._default_provenance_tracking_lookaside_map

    def stock_traces():
        torch.manual_seed(0)
        jitted = thunder.jit(module_class())
        try:
            jitted(torch.randn(2, 4))
        except RuntimeError as error:  # the hook counter's check: its values differ between the two runs
            return re.sub(r"\d+", "N", str(error))
        traces = (*thunder.last_prologue_traces(jitted), *thunder.last_traces(jitted))
        return [_trace_without_comments(t) for t in traces]

    with_patches = stock_traces()
    patches.uninstall()
    try:
        without = stock_traces()
    finally:
        patches.install()
    assert with_patches == without
    assert isinstance(with_patches, str) == (module_class is _RegistersHooks)  # stock fails on the hook counter


def test_one_disassembly_per_code_object():
    """thunder's interpreter reads a code object's instructions from one disassembly while the code
    lives: dis's instructions, the same traces as with thunder's own ``dis``; dis's answer outside
    discover() compilations."""
    import dis
    import gc

    thunderplug.discover()
    patch = next(p for p in patches.PATCHES if p.name == "one disassembly per code object")
    once = patch.read()
    assert once.Instruction is dis.Instruction and once.opmap is dis.opmap
    torch.manual_seed(0)
    module, x = _Builtins(), torch.randn(2, 4, requires_grad=True)
    namespace: dict = {}
    # a code object that dies, with a nested one that dies with it (freeing one entry frees another)
    exec("def scaled(t):\n    return (lambda u: u * 2)(t)\n", namespace)  # noqa: S102
    scaled = namespace.pop("scaled")
    fast = _compiled_traces(module, x)
    torch.testing.assert_close(thunder.jit(scaled, executors=thunderplug.discover())(x), x * 2)
    code = _Builtins.forward.__code__
    assert once._instructions[id(code)][1] == tuple(dis.get_instructions(code))
    assert not isinstance(once.get_instructions(code), tuple)  # outside a compilation: dis's generator
    keys = [id(scaled.__code__), id(next(c for c in scaled.__code__.co_consts if isinstance(c, type(code))))]
    assert all(key in once._instructions for key in keys)
    del scaled, namespace
    gc.collect()
    assert not any(key in once._instructions for key in keys)  # forgotten with their code objects
    _assert_same_compilation(fast, _traces_with_thunders_own(patch, module, x))


class _Loops(torch.nn.Module):
    """Interpreted ``for`` loops over a ``ModuleList``, a dict's items and a tuple (each ends in a
    ``StopIteration`` through thunder's iterator helpers), and a ``KeyError`` caught in ``forward``."""

    def __init__(self):
        super().__init__()
        self.linears = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.scales = (2.0, 0.5)

    def forward(self, x):
        named = {"a": 2.0, "b": 0.25}
        for _ in range(8):
            for linear in self.linears:
                x = linear(x).tanh()
            for scale in self.scales:
                x = x * scale
            for _, scale in named.items():
                x = x * scale
        try:
            x = x * named["missing"]
        except KeyError:
            x = x + 1
        return x.sum()


def _same_loops_of_another_class(module: _Loops, name: str) -> _Loops:
    """``module``'s parameters in a subclass named ``name``: a structure of its own, compiled again
    rather than shared ("one compilation per module structure")."""
    other = type(name, (_Loops,), {})()
    other.load_state_dict(module.state_dict())
    return other


def _raises_in_a_loop(x):
    for scale in [1.0, 2.0]:
        x = x * scale
    return _fails(x)


def _fails(x):
    raise ValueError(f"no {x.shape}")


def test_traceback_frames_are_made_once_per_position(monkeypatch):
    """An exception leaving an interpreted frame gets its traceback frame without a thread per exception:
    one per position (file, function, line), kept for later compilations; the same traces, values and
    gradients as with thunder's own frames, and an error raised in jitted code keeps its traceback's
    files, functions and lines."""
    import _thread
    import traceback

    thunderplug.discover()
    patch = next(p for p in patches.PATCHES if p.name == "traceback frames without spinning")
    started: list = []
    start = _thread.start_new_thread

    def counted(*args, **kwargs):
        started.append(args[0])
        return start(*args, **kwargs)

    monkeypatch.setattr(_thread, "start_new_thread", counted)
    torch.manual_seed(0)
    module, x = _Loops(), torch.randn(2, 4, requires_grad=True)
    fast = _compiled_traces(module, x)
    first = len(started)
    assert 0 < first <= 12, first  # thunder's own: one per exception and frame it leaves (over 100 here)
    assert _compiled_traces(_same_loops_of_another_class(module, "_MoreLoops"), x)[2] == fast[2]
    assert len(started) == first  # the positions' frames are kept
    expected = module(x)
    torch.testing.assert_close(fast[0], expected, rtol=0, atol=0)
    for got, want in zip(fast[1], torch.autograd.grad(expected, [x, *module.parameters()]), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    own = _traces_with_thunders_own(patch, _same_loops_of_another_class(module, "_OwnLoops"), x)
    assert len(started) > first + 100
    _assert_same_compilation(fast, own)

    def frames_of_error(jitted):
        with pytest.raises(ValueError, match="no") as info:
            jitted(torch.ones(2))
        return [(f.filename, f.name, f.lineno) for f in traceback.extract_tb(info.value.__traceback__)
                if f.filename == __file__]

    made = frames_of_error(thunder.jit(_raises_in_a_loop, executors=thunderplug.discover()))
    with _standing_in(*_thunders_own(patch)):
        assert made == frames_of_error(thunder.jit(_raises_in_a_loop, executors=thunderplug.discover()))
    assert [name for _, name, _ in made][-2:] == ["_raises_in_a_loop", "_fails"]


def test_symbols_bind_as_thunders_with_one_signature_per_meta(monkeypatch):
    """Arguments bind as thunder's ``Symbol.normalize`` binds them (positional, keyword, defaults): the same
    traces, values and gradients; each meta's signature is computed once; outside discover() compilations
    (no active executor) thunder's own normalize runs."""
    import inspect
    import types

    import thunder.torch as ltorch
    from thunder.core.symbol import Symbol

    from thunderplug.wiring import speedups

    thunderplug.discover()
    patch = next(p for p in patches.PATCHES if p.name == "one signature per meta")
    once, original = patch.read(), patches._originals[patch.name][0]
    torch.manual_seed(0)
    module, x = _Builtins(), torch.randn(2, 4, requires_grad=True)
    asked: list = []
    computed = inspect.signature

    def counted(fn, *args, **kwargs):
        asked.append(fn)
        return computed(fn, *args, **kwargs)

    monkeypatch.setattr(speedups, "inspect", types.SimpleNamespace(signature=counted))
    fast = _compiled_traces(module, x)
    assert len(asked) == len({id(fn) for fn in asked}), "a meta's signature was computed twice"

    def scaled_meta(a, /, scale=2.0):
        return ltorch.mul(a, scale)

    scaled = Symbol(name="scaled_by", meta=scaled_meta, _module=None)
    jitted = thunder.jit(lambda t: scaled(scaled(t), scale=0.5), executors=thunderplug.discover())
    torch.testing.assert_close(jitted(x), x * 2 * 0.5)
    assert [fn for fn in asked if fn is scaled_meta] == [scaled_meta]
    _assert_same_compilation(fast, _traces_with_thunders_own(patch, module, x))
    symbol = Symbol(name="scaled", meta=lambda a, /, scale=2, *, shift=0: a)
    assert once(symbol, 1, shift=3) == original(symbol, 1, shift=3) == ((1, 2), {"shift": 3})
    monkeypatch.setattr(inspect, "signature", counted)
    asked.clear()
    once(symbol, 1), once(symbol, 1)  # outside a compilation: thunder's, computing it each time
    assert len(asked) == 2


def _branches_on_is_compiling(x):
    return x + 1 if not torch.compiler.is_compiling() else x - 1


def test_is_compiling_is_false_as_in_eager():
    x = torch.randn(3)
    torch.testing.assert_close(thunder.jit(_branches_on_is_compiling, executors=thunderplug.discover())(x), x + 1)


def test_stock_thunder_answers_is_compiling_true():
    """What the patch changes: stock thunder takes the branch written for Dynamo + Inductor."""
    x = torch.randn(3)
    torch.testing.assert_close(thunder.jit(_branches_on_is_compiling)(x), x - 1)


class _ShiftBits(torch.autograd.Function):
    """An in-place op on a view inside a Function's forward (torchao MX's fp4 packing does this)."""

    @staticmethod
    def forward(ctx, x):
        bits = (x * 2).view(torch.int32)
        bits -= 1
        return bits.view(torch.float32) + x

    @staticmethod
    def backward(ctx, grad):
        return grad * 3


def _shift_bits_sum(x):
    return _ShiftBits.apply(x).sum()


@pytest.mark.parametrize("executors", ["stock", "discover"])
def test_in_place_ops_in_a_function_forward(executors):
    """thunder 0.2.6 alone: "Detected a cycle while swapping" (alias updates reuse the forward's names)."""
    thunderplug.discover()
    x = torch.randn(8, requires_grad=True)
    expected = _shift_bits_sum(x)
    (expected_grad,) = torch.autograd.grad(expected, x)
    jitted = thunder.jit(_shift_bits_sum, **({"executors": thunderplug.discover()} if executors == "discover" else {}))
    actual = jitted(x)
    (actual_grad,) = torch.autograd.grad(actual, x)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    torch.testing.assert_close(actual_grad, expected_grad, rtol=0, atol=0)


def _index_put(x, v, idx, accumulate):
    return x.index_put((idx,), v, accumulate=accumulate).sin()


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("values_shape", [(2, 4), (4,), (1, 4)], ids=["full", "broadcast", "broadcast-1"])
def test_index_put_gives_values_their_gradient(accumulate, values_shape):
    torch.manual_seed(0)
    x, v = torch.randn(3, 4, requires_grad=True), torch.randn(values_shape, requires_grad=True)
    idx = torch.tensor([0, 2])
    grad = torch.randn(3, 4)
    expected = torch.autograd.grad(_index_put(x, v, idx, accumulate), (x, v), grad)
    jitted = thunder.jit(_index_put, executors=thunderplug.discover(quiet=True))
    actual = torch.autograd.grad(jitted(x, v, idx, accumulate), (x, v), grad)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want)


def test_stock_thunder_drops_the_gradient_of_index_put_values():
    """What the patch changes (known-issues KI-7), so that it is not silently a no-op."""
    x, v = torch.randn(3, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True)
    out = thunder.jit(_index_put)(x, v, torch.tensor([0, 2]), False)
    assert torch.autograd.grad(out.sum(), (x, v), allow_unused=True)[1] is None


class _Float8Block(torch.nn.Module):
    """LayerNorm, a float8 MLP with GELU and cross-entropy: subclass ops (unrolled ATen ops for the
    ``aten`` executor), torch-executor ops with and without execution transforms, composites."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 16)

    def forward(self, x, target):
        hidden = torch.nn.functional.gelu(self.up(self.norm(x)))
        return torch.nn.functional.cross_entropy(self.down(hidden.transpose(0, 1).transpose(0, 1)), target)


def _executed(trace) -> list[tuple[str, str | None]]:
    return [(b.sym.name, b.sym.executor.name if b.sym.executor else None) for b in trace.bound_symbols]


def _operators_bound_directly(monkeypatch) -> list:
    """The operators the claims-bound-directly replacement binds from now on (directly or as an
    execution transform records them), in a list."""
    from thunderplug.wiring import speedups

    bound: list = []
    real_bound_to, real_transformed = speedups._bound_to, speedups._transformed

    def transformed(transform, bsym, trace):
        recorded = real_transformed(transform, bsym, trace)
        bound.extend(b.sym for b in recorded or ())
        return recorded

    def bound_to(operator, bsym):
        bound.append(operator)
        return real_bound_to(operator, bsym)

    monkeypatch.setattr(speedups, "_bound_to", bound_to)
    monkeypatch.setattr(speedups, "_transformed", transformed)
    return bound


def test_direct_claims_execute_what_thunders_claims_execute(monkeypatch):
    """Claims bound directly give the traces thunder's claiming gives (the same symbols, executors
    and order; proxy names may differ) and the same bits, eager's values and gradients."""
    float8 = pytest.importorskip("torchao.float8")
    thunderplug.discover(quiet=True)
    patch = next(p for p in patches.PATCHES if p.name == "claims bound directly")
    torch.manual_seed(0)
    model = float8.convert_to_float8_training(_Float8Block(), config=float8.Float8LinearConfig(emulate=True))
    x, target = torch.randn(8, 32, requires_grad=True), torch.randint(0, 16, (8,))
    expected = model(x, target)
    expected_grads = torch.autograd.grad(expected, (x, *model.parameters()))
    bound = _operators_bound_directly(monkeypatch)

    def compiled():
        jitted = thunder.jit(copy.deepcopy(model), executors=thunderplug.discover(quiet=True))
        result = jitted(x, target)
        grads = torch.autograd.grad(result, (x, *jitted.parameters()))
        torch.testing.assert_close(result, expected)
        for got, want in zip(grads, expected_grads):
            torch.testing.assert_close(got, want)
        traces = (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1])
        return result, grads, [_executed(t) for t in traces]

    direct = compiled()
    assert {op.executor.name for op in bound} >= {"aten", "torch"}
    assert {"permute", "transpose"} & {op.name for op in bound}  # recorded by torch's execution transforms
    with _standing_in(*_thunders_own(patch)):
        bound.clear()
        claimed_by_thunder = compiled()
    assert not bound
    assert direct[2] == claimed_by_thunder[2]
    torch.testing.assert_close(direct[0], claimed_by_thunder[0], rtol=0, atol=0)
    for got, want in zip(direct[1], claimed_by_thunder[1]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_direct_claims_step_aside_for_thunder_transforms(monkeypatch):
    """A compilation with thunder transforms (which may re-shape inputs and rely on the metas running
    again) is claimed by thunder's pass alone."""
    from thunder.core.transform_common import Transform

    bound = _operators_bound_directly(monkeypatch)
    x = TwoTensor(torch.randn(4, 5), torch.randn(4, 5)).requires_grad_()
    fn = lambda x: (x.sin() * 2).sum()  # noqa: E731
    jitted = thunder.jit(fn, executors=thunderplug.discover(quiet=True), transforms=[Transform()])
    torch.testing.assert_close(jitted(x), fn(x))
    assert not bound
    thunder.jit(fn, executors=thunderplug.discover(quiet=True))(x)
    assert bound


def test_autograd_links_are_meta_tensors_made_without_drawing(monkeypatch):
    """thunder links the two autograd Functions of a compiled call by a meta tensor it made with
    ``torch.randn`` (torch's slow Python reference on meta; ~1 ms per region step): made with
    ``torch.empty`` instead, alike in every respect; other ``randn`` calls are torch's; the
    gradients are eager's."""
    from thunder.executors import torch_autograd

    thunderplug.discover()
    linked = torch_autograd.torch
    assert linked.Tensor is torch.Tensor and linked.enable_grad is torch.enable_grad
    with monkeypatch.context() as patched:
        patched.setattr(torch, "enable_grad", "patched later")
        assert linked.enable_grad == "patched later"  # read through, never a stale copy
    made = linked.randn(1, device="meta", requires_grad=True)
    reference = torch.randn(1, device="meta", requires_grad=True)
    assert (made.shape, made.dtype, made.device, made.requires_grad, made.is_leaf) == (
        reference.shape, reference.dtype, reference.device, reference.requires_grad, reference.is_leaf
    )
    assert linked.randn(1, device=torch.device("meta")).device.type == "meta"
    torch.manual_seed(3)
    drawn = linked.randn(2, 3)
    torch.manual_seed(3)
    assert torch.equal(drawn, torch.randn(2, 3))  # not on meta: torch's own

    drawn_on_meta = []
    real_randn = torch.randn

    def counting_randn(*args, **kwargs):
        if str(kwargs.get("device")) == "meta":
            drawn_on_meta.append(args)
        return real_randn(*args, **kwargs)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    expected = copy.deepcopy(model)
    x = torch.randn(3, 4, requires_grad=True)
    x_eager = x.detach().clone().requires_grad_()
    jitted = thunder.jit(model, executors=thunderplug.discover())
    monkeypatch.setattr(torch, "randn", counting_randn)
    jitted(x).square().sum().backward()
    monkeypatch.undo()
    expected(x_eager).square().sum().backward()
    assert drawn_on_meta == []  # thunder's own torch.randn would have drawn two (forward, backward)
    torch.testing.assert_close(x.grad, x_eager.grad, rtol=0, atol=0)
    for got, want in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0)
