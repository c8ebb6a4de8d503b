"""Loading, isolating, ordering and reporting plugins."""

import json
import subprocess
import sys

import pytest
import torch

import thunderplug
from thunderplug import ExecutorSpec, PluginHost, Status, hookimpl
from thunderplug.commands.cli import main

GOOD = """
from thunderplug import ExecutorSpec, hookimpl
from thunder.extend import OperatorExecutor

@hookimpl
def register_executors(register):
    register(ExecutorSpec("{name}", lambda: OperatorExecutor("{name}"), priority={priority}))
"""


def statuses(host: PluginHost) -> dict:
    return {s.name: s for s in host.report()}


def test_each_kind_of_broken_plugin_is_isolated(fake_dists):
    fake_dists.add("good", GOOD.format(name="good_ex", priority=5))
    fake_dists.add("no_module", "import a_module_that_does_not_exist_anywhere\n")
    fake_dists.add("no_library", "raise OSError('libcudart.so.12: cannot open shared object file')\n")
    fake_dists.add(
        "hook_raises",
        """
        from thunderplug import hookimpl
        @hookimpl
        def register_executors(register):
            raise RuntimeError("boom in register_executors")
        """,
    )
    fake_dists.add(
        "misspelled",
        """
        from thunderplug import hookimpl
        @hookimpl
        def register_executor(register):  # missing the final s
            pass
        """,
    )
    host = PluginHost(environ={})
    found = statuses(host)

    assert found["good"].status is Status.ACTIVE
    assert found["good"].executors == ["good_ex"]
    assert found["good"].distribution == "fake-good" and found["good"].version == "1.0"
    assert found["no_module"].status is Status.UNAVAILABLE
    assert "a_module_that_does_not_exist_anywhere" in found["no_module"].reason
    assert found["no_library"].status is Status.UNAVAILABLE
    assert "libcudart.so.12" in found["no_library"].reason
    assert found["hook_raises"].status is Status.FAILED
    assert "boom in register_executors" in found["hook_raises"].reason
    assert found["misspelled"].status is Status.INVALID
    assert "register_executor" in found["misspelled"].reason

    names = [ex.name for ex in thunderplug.discover(host=host, include_defaults=False)]
    assert "good_ex" in names


def test_a_misspelled_hook_names_the_hook_meant(plugin_host):
    class Misspelled:
        @hookimpl
        def register_claim(self, register):  # missing the final s
            pass

    class Unrelated:
        @hookimpl
        def setup(self):
            pass

    misspelled = plugin_host.add_plugin(Misspelled(), "typo_plugin")
    assert misspelled.status is Status.INVALID
    assert "unknown hook 'register_claim'" in misspelled.reason
    assert misspelled.reason.endswith("did you mean 'register_claims'?")
    unrelated = plugin_host.add_plugin(Unrelated(), "unrelated_plugin")
    assert unrelated.reason.endswith(
        "the hooks are register_aten_ops, register_claims, register_executors, unavailable_reason"
    )


def test_strict_mode_reraises(fake_dists):
    fake_dists.add("no_library", "raise OSError('missing libfoo.so')\n")
    with pytest.raises(OSError, match="libfoo"):
        PluginHost(environ={"THUNDERPLUG_STRICT": "1", "THUNDERPLUG_PLUGINS": "no_library"}).report()


def test_unavailable_reason_skips_other_hooks(plugin_host):
    calls = []

    class NeedsCuda:
        @hookimpl
        def unavailable_reason(self):
            return "no CUDA device"

        @hookimpl
        def register_executors(self, register):
            calls.append("register_executors")

    status = plugin_host.add_plugin(NeedsCuda(), "needs_cuda")
    assert (status.status, status.reason) == (Status.UNAVAILABLE, "no CUDA device")
    assert calls == []


def test_allowlist_and_blocklist(fake_dists):
    for name in ("alpha", "beta", "gamma"):
        fake_dists.add(name, GOOD.format(name=f"{name}_ex", priority=0))

    only = statuses(PluginHost(environ={"THUNDERPLUG_PLUGINS": "alpha, gamma"}))
    assert only["alpha"].status is Status.ACTIVE and only["gamma"].status is Status.ACTIVE
    assert only["beta"].status is Status.DISABLED and "THUNDERPLUG_PLUGINS" in only["beta"].reason

    none = statuses(PluginHost(environ={"THUNDERPLUG_PLUGINS": ""}))
    assert {none[n].status for n in ("alpha", "beta", "gamma")} == {Status.DISABLED}

    blocked = statuses(PluginHost(environ={"THUNDERPLUG_DISABLE": "beta"}))
    assert blocked["beta"].status is Status.DISABLED and "THUNDERPLUG_DISABLE" in blocked["beta"].reason
    assert blocked["alpha"].status is Status.ACTIVE


def test_order_is_priority_then_name_not_install_order(plugin_host):
    def plugin(name, priority):
        class Plugin:
            @hookimpl
            def register_executors(self, register):
                register(ExecutorSpec(name, lambda: f"executor {name}", priority=priority))

        return Plugin()

    for name, priority in [("zeta", 100), ("beta", 5), ("alpha", 5), ("omega", 500)]:
        plugin_host.add_plugin(plugin(name, priority), name)
    core = ["thunderplug", "thunderplug_broadcast_grads"]  # thunderplug's own plugins, by the same rule
    assert [spec.name for spec in plugin_host.executor_specs()] == [*core, "omega", "zeta", "alpha", "beta"]
    assert [spec.name for spec in plugin_host.executor_specs(only=["beta", "omega"])] == [*core, "omega", "beta"]
    assert [spec.name for spec in plugin_host.executor_specs(exclude=["zeta", "thunderplug_broadcast_grads"])] == [
        "thunderplug",
        "omega",
        "alpha",
        "beta",
    ]


def test_duplicate_executor_name_skips_the_later_plugin_and_names_both(fake_dists):
    fake_dists.add("first", GOOD.format(name="same_name", priority=0))
    fake_dists.add("second", GOOD.format(name="same_name", priority=0))
    fake_dists.add("steals_aten", GOOD.format(name="aten", priority=0))
    host = PluginHost(environ={})
    found = statuses(host)
    assert found["first"].status is Status.ACTIVE
    assert found["second"].status is Status.CONFLICT and found["steals_aten"].status is Status.CONFLICT
    assert "fake-first" in found["second"].reason and "fake-second" in found["second"].reason
    assert "thunderplug-aten" in found["steals_aten"].reason and "fake-steals-aten" in found["steals_aten"].reason
    assert found["aten_ops"].status is Status.ACTIVE
    names = [ex.name for ex in thunderplug.discover(host=host, include_defaults=False)]
    assert names.count("same_name") == 1 and "aten" in names
    with pytest.raises(thunderplug.DuplicateRegistrationError, match="fake-second"):
        PluginHost(environ={"THUNDERPLUG_STRICT": "1", "THUNDERPLUG_PLUGINS": "first,second"}).report()


def test_failing_executor_factory_marks_only_its_plugin_failed(plugin_host):
    class Broken:
        @hookimpl
        def register_executors(self, register):
            register(ExecutorSpec("broken_ex", lambda: 1 / 0))

    class Fine:
        @hookimpl
        def register_executors(self, register):
            from thunder.extend import OperatorExecutor

            register(ExecutorSpec("fine_ex", lambda: OperatorExecutor("fine_ex")))

    plugin_host.add_plugin(Broken(), "broken")
    plugin_host.add_plugin(Fine(), "fine")
    names = [ex.name for ex in thunderplug.discover(host=plugin_host, include_defaults=False)]
    assert "fine_ex" in names and "broken_ex" not in names
    assert statuses(plugin_host)["broken"].status is Status.FAILED
    assert "ZeroDivisionError" in statuses(plugin_host)["broken"].reason


def test_discover_appends_thunder_defaults_once():
    import thunder

    executors = thunderplug.discover()
    names = [ex.name for ex in executors]
    assert names[0] == "thunderplug"
    for default in thunder.get_default_executors():
        assert names.count(default.name) == 1
    assert not {ex.name for ex in thunder.get_default_executors()} & {
        ex.name for ex in thunderplug.discover(include_defaults=False)
    }


def test_installed_plugins_report_on_this_machine():
    found = {s.name: s for s in thunderplug.report()}
    assert found["aten_ops"].status is Status.ACTIVE and found["aten_ops"].aten_ops >= 5
    assert found["float8"].status is Status.ACTIVE


def test_cli_json_report(capsys):
    assert main(["plugins", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)["plugins"]
    by_name = {r["name"]: r for r in records}
    assert {"name", "status", "reason", "version", "executors", "hooks", "module"} <= set(by_name["aten_ops"])
    assert "aten" in by_name["aten_ops"]["executors"]


def test_cli_table(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["name", "distribution", "version", "status"]
    assert "thunderplug-aten" in out


def test_python_dash_m_entry_point():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "thunderplug", "plugins", "--json"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert any(r["name"] == "aten_ops" for r in json.loads(result.stdout)["plugins"])


@pytest.mark.parametrize("plugin", ["transformer_engine", "nvfuser"])
def test_cuda_plugins_say_why_they_are_unavailable(plugin):
    from thunderplug.plugin_api.availability import cuda_unavailable_reason

    status = {s.name: s for s in thunderplug.report()}[plugin]
    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA is available here; the package check decides")
    assert status.status is Status.UNAVAILABLE and reason in status.reason


@pytest.mark.requires_cuda
def test_requires_cuda_marker_skips_without_cuda():
    import torch

    assert torch.cuda.is_available()


BAD_REGISTRATION = """
from thunderplug import hookimpl

@hookimpl
def register_executors(register):
    register("not a spec")
"""

NOT_AN_EXECUTOR = """
from thunderplug import ExecutorSpec, hookimpl

@hookimpl
def register_executors(register):
    register(ExecutorSpec("not_an_executor", lambda: "a string"))
"""


def test_wrong_registrations_make_only_that_plugin_invalid(fake_dists):
    import thunder

    fake_dists.add("registers_a_str", BAD_REGISTRATION)
    fake_dists.add("builds_a_str", NOT_AN_EXECUTOR)
    host = PluginHost(environ={})
    found = statuses(host)
    assert found["registers_a_str"].status is Status.INVALID
    assert (
        "register('not a spec')" in found["registers_a_str"].reason
        and "ExecutorSpec" in found["registers_a_str"].reason
    )
    assert found["aten_ops"].status is Status.ACTIVE  # report() works: `thunderplug plugins` does not crash

    with pytest.warns(thunderplug.ThunderplugWarning, match="builds_a_str"):
        executors = thunderplug.discover(host=host)
    assert found["builds_a_str"].status is Status.INVALID
    assert "'not_an_executor'" in found["builds_a_str"].reason and "str" in found["builds_a_str"].reason
    assert {"thunderplug", "aten"} <= {ex.name for ex in executors}

    x = torch.randn(3, 4, requires_grad=True)  # the user's call is unaffected
    jitted = thunder.jit(lambda x: (x * 2).sin().sum(), executors=executors)
    torch.testing.assert_close(jitted(x), (x * 2).sin().sum())


def test_one_warning_per_broken_plugin_per_process_and_quiet(plugin_host, recwarn):
    class Broken:
        @hookimpl
        def register_executors(self, register):
            raise RuntimeError("a bug in the plugin")

    plugin_host.add_plugin(Broken(), "warned_once_plugin")
    thunderplug.discover(host=plugin_host, quiet=True)
    assert not [w for w in recwarn if "warned_once_plugin" in str(w.message)]
    thunderplug.discover(host=plugin_host)
    thunderplug.discover(host=plugin_host)
    messages = [str(w.message) for w in recwarn if "warned_once_plugin" in str(w.message)]
    assert len(messages) == 1
    assert "failed" in messages[0] and "a bug in the plugin" in messages[0]
    assert "thunderplug plugins" in messages[0] and "THUNDERPLUG_QUIET=1" in messages[0]
    assert recwarn[-1].filename == __file__  # points at the user's discover() call


def test_a_plugin_that_cannot_run_here_is_listed_not_warned_about(plugin_host, recwarn):
    class NeedsAGpu:
        @hookimpl
        def unavailable_reason(self):
            return "no CUDA device"

    class GpuExecutorOnly:
        @hookimpl
        def register_executors(self, register):
            register(ExecutorSpec("gpu_only", lambda: None, unavailable_reason=lambda: "no CUDA device"))

    plugin_host.add_plugin(NeedsAGpu(), "needs_a_gpu")
    plugin_host.add_plugin(GpuExecutorOnly(), "gpu_executor_only")
    thunderplug.discover(host=plugin_host)
    assert not [w for w in recwarn if issubclass(w.category, thunderplug.ThunderplugWarning)]
    found = statuses(plugin_host)
    assert found["needs_a_gpu"].status is found["gpu_executor_only"].status is Status.UNAVAILABLE


def test_installed_cpu_plugins_give_no_warning_on_this_machine():
    """The bundled CUDA plugins, unavailable on a CPU machine, leave a CPU script silent."""
    script = "import thunderplug, thunder, warnings; warnings.simplefilter('always'); thunderplug.discover()"
    result = subprocess.run([sys.executable, "-W", "always::UserWarning", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr and "transformer_engine module not found" not in result.stderr


def test_quiet_environment_variable(recwarn):
    class Broken:
        @hookimpl
        def register_executors(self, register):
            raise RuntimeError("another bug")

    host = PluginHost(load_entry_points=False, environ={"THUNDERPLUG_QUIET": "1"})
    host.add_plugin(Broken(), "quiet_env_plugin")
    thunderplug.discover(host=host)
    assert not [w for w in recwarn if "quiet_env_plugin" in str(w.message)]


@pytest.mark.parametrize(
    ("value", "strict"),
    [
        ("1", True),
        ("true", True),
        ("Yes", True),
        ("ON", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("off", False),
        ("", False),
    ],
)
def test_booleans_are_parsed_as_people_write_them(fake_dists, value, strict):
    fake_dists.add("no_library_bool", "raise OSError('missing libbar.so')\n")
    host = PluginHost(environ={"THUNDERPLUG_STRICT": value, "THUNDERPLUG_PLUGINS": "no_library_bool"})
    assert host.strict is strict
    if strict:
        with pytest.raises(OSError, match="libbar"):
            host.report()
    else:
        assert statuses(host)["no_library_bool"].status is Status.UNAVAILABLE


def test_a_value_that_is_no_boolean_is_a_warning():
    with pytest.warns(thunderplug.ThunderplugWarning, match="THUNDERPLUG_STRICT='maybe' is not a boolean"):
        assert PluginHost(environ={"THUNDERPLUG_STRICT": "maybe"}).strict is False


@pytest.mark.parametrize("variable", ["THUNDERPLUG_PLUGINS", "THUNDERPLUG_DISABLE"])
def test_unknown_plugin_names_are_a_warning(variable):
    with pytest.warns(
        thunderplug.ThunderplugWarning, match=rf"{variable} names 'nonexistent_{variable.lower()}'"
    ) as caught:
        PluginHost(environ={variable: f"aten_ops, nonexistent_{variable.lower()}"}).report()
    assert "installed: aten_ops, " in str(caught[0].message) and "thunderplug_broadcast_grads" in str(caught[0].message)


def test_allowlist_keeps_thunderplugs_own_executors():
    host = PluginHost(environ={"THUNDERPLUG_PLUGINS": "aten_ops"})
    found = statuses(host)
    assert found["thunderplug"].status is Status.ACTIVE and found["thunderplug"].builtin
    assert found["float8"].status is Status.DISABLED
    names = [ex.name for ex in thunderplug.discover(host=host, include_defaults=False)]
    assert names == ["thunderplug", "thunderplug_broadcast_grads", "eager_backward_kernels", "eager_kernels", "aten"]
    blocked = PluginHost(environ={"THUNDERPLUG_DISABLE": "thunderplug_broadcast_grads"})
    assert statuses(blocked)["thunderplug_broadcast_grads"].status is Status.DISABLED
    assert "thunderplug_broadcast_grads" not in [ex.name for ex in thunderplug.discover(host=blocked)]


def test_availability_is_per_executor(plugin_host):
    from thunder.extend import OperatorExecutor

    class TwoMachines:
        @hookimpl
        def register_executors(self, register):
            register(
                ExecutorSpec(
                    "gpu_only_ex", lambda: OperatorExecutor("gpu_only_ex"), unavailable_reason=lambda: "no GPU here"
                )
            )
            register(ExecutorSpec("cpu_ex", lambda: OperatorExecutor("cpu_ex"), unavailable_reason=lambda: None))

    status = plugin_host.add_plugin(TwoMachines(), "two_machines")
    assert (status.status, status.executors, status.unavailable_executors) == (
        Status.ACTIVE,
        ["cpu_ex"],
        {"gpu_only_ex": "no GPU here"},
    )
    assert "gpu_only_ex" not in [ex.name for ex in thunderplug.discover(host=plugin_host)]


def test_mark_failed_forgets_fusion_claims(plugin_host):
    from thunderplug.plugin_api.specs import FusionFilter

    class Filters:
        @hookimpl
        def register_claims(self, register):
            register(FusionFilter("keep_out", "torchcompile", lambda bsym: "never"))

    plugin_host.add_plugin(Filters(), "filters")
    assert len(plugin_host.fusion_claims()) == 1
    plugin_host.mark_failed("filters", RuntimeError("broke later"))
    assert plugin_host.fusion_claims() == []
    assert statuses(plugin_host)["filters"].status is Status.FAILED


def test_report_lists_hooks_and_module(plugin_host):
    class Hooks:
        @hookimpl
        def unavailable_reason(self):
            return None

        @hookimpl
        def register_executors(self, register):
            pass

    status = plugin_host.add_plugin(Hooks(), "hooks_listed")
    assert status.hooks == ["register_executors", "unavailable_reason"]
    assert status.module == f"{__name__}:test_report_lists_hooks_and_module.<locals>.Hooks"
    core = statuses(plugin_host)["thunderplug"]
    assert (core.module, core.hooks, core.executors) == (
        "thunderplug.host.builtins:CorePlugin",
        ["register_executors"],
        ["thunderplug"],
    )


def test_first_discover_from_several_threads_agrees(fake_dists):
    from concurrent.futures import ThreadPoolExecutor

    fake_dists.add("racy", GOOD.format(name="racy_ex", priority=5))
    host = PluginHost(environ={})
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: [ex.name for ex in thunderplug.discover(host=host, quiet=True)], range(4)))
    assert all(result == results[0] for result in results) and "racy_ex" in results[0]


def test_a_plugin_whose_second_executor_fails_is_dropped_whole(plugin_host):
    from thunder.extend import OperatorExecutor

    class HalfBroken:
        @hookimpl
        def register_executors(self, register):
            register(ExecutorSpec("half_first", lambda: OperatorExecutor("half_first"), priority=50))
            register(ExecutorSpec("half_second", lambda: 1 / 0, priority=40))

    plugin_host.add_plugin(HalfBroken(), "half_broken")
    names = [ex.name for ex in thunderplug.discover(host=plugin_host, quiet=True)]
    assert "half_first" not in names and "half_second" not in names and "thunderplug" in names
    status = statuses(plugin_host)["half_broken"]
    assert status.status is Status.FAILED and status.executors == [] and "ZeroDivisionError" in status.reason


BROKEN_PLUGINS = {
    "missing_module": ("import a_module_that_does_not_exist_anywhere\n", Status.UNAVAILABLE, "a_module_that_does_not"),
    "missing_library": ("raise OSError('libfoo.so: cannot open shared object file')\n", Status.UNAVAILABLE, "libfoo"),
    "hook_raises": (
        "from thunderplug import hookimpl\n@hookimpl\ndef register_aten_ops(register):\n    raise KeyError('boom')\n",
        Status.FAILED,
        "KeyError",
    ),
    "misspelled_hook": (
        "from thunderplug import hookimpl\n@hookimpl\ndef register_claim(register):\n    pass\n",
        Status.INVALID,
        "register_claim",
    ),
    "not_a_spec": (BAD_REGISTRATION, Status.INVALID, "not a spec"),
    "not_an_executor": (NOT_AN_EXECUTOR, Status.INVALID, "not_an_executor"),
    "duplicate_name": (GOOD.format(name="float8", priority=0), Status.CONFLICT, "thunderplug-float8"),
}


@pytest.mark.parametrize("mode", sorted(BROKEN_PLUGINS))
def test_each_broken_mode_leaves_the_others_and_the_users_call_alone(fake_dists, mode):
    import thunder
    from torch.testing._internal.two_tensor import TwoTensor

    source, expected_status, in_reason = BROKEN_PLUGINS[mode]
    name = f"zz_broken_{mode}"  # loaded after float8 (entry points load by name), so it is the later provider
    fake_dists.add(name, source)
    host = PluginHost(environ={})
    executors = thunderplug.discover(host=host, quiet=True)
    status = statuses(host)[name]
    assert status.status is expected_status and in_reason in status.reason
    assert {"thunderplug", "thunderplug_broadcast_grads", "aten", "float8"} <= {ex.name for ex in executors}
    assert {s.name for s in host.report() if s.status is Status.ACTIVE} >= {"aten_ops", "float8"}

    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4)).requires_grad_()
    out, expected = thunder.jit(lambda x: (x * 2).sin(), executors=executors)(x), (x * 2).sin()
    torch.testing.assert_close(out.a, expected.a)
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(expected))
    (expected_grad,) = torch.autograd.grad(expected, x, torch.ones_like(expected))
    torch.testing.assert_close(grad.b, expected_grad.b)
