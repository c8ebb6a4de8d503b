"""discover() leaves thunder's registry of executors (``thunder.get_all_executors()``, which thunder's
test_extend.py checks lists exactly thunder's own) as it was (issue 23), and what thunder looks up by
name still works with thunderplug's executors: the prologue and initial traces pickle (thunder's
test_serialize_trace), and thunderfx compiles with them."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_discover_adds_nothing_to_thunders_executor_registry():
    script = textwrap.dedent(
        """
        import pickle, torch, thunder, thunderplug
        before = [e.name for e in thunder.get_all_executors()]
        executors = thunderplug.discover(quiet=True)
        after = [e.name for e in thunder.get_all_executors()]
        assert after == before, sorted(set(after) - set(before))
        assert {"aten", "eager_kernels"} <= {e.name for e in executors}

        def f(x, w):
            return torch.nn.functional.gelu(x @ w).sum()

        x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
        jitted = thunder.jit(f, executors=executors)
        result = jitted(x, w)
        torch.testing.assert_close(result, f(x, w))
        got = torch.autograd.grad(result, (x, w))
        for g, e in zip(got, torch.autograd.grad(f(x, w), (x, w))):
            torch.testing.assert_close(g, e)
        for trace in (thunder.last_traces(jitted)[0], thunder.last_prologue_traces(jitted)[0]):
            assert str(pickle.loads(pickle.dumps(trace))) == str(trace)

        from thunder.dynamo import ThunderCompiler
        compiled = torch.compile(f, backend=ThunderCompiler(executors=executors))
        torch.testing.assert_close(compiled(x, w), f(x, w))
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
