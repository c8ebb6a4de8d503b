"""Loading, isolating, ordering and reporting plugins."""

import json

import pytest

import thunderplug
from thunderplug import ExecutorSpec, PluginHost, Status, hookimpl
from thunderplug.cli import main

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


def test_strict_mode_reraises(fake_dists):
    fake_dists.add("no_library", "raise OSError('missing libfoo.so')\n")
    with pytest.raises(OSError, match="libfoo"):
        PluginHost(environ={"THUNDERPLUG_STRICT": "1"}).report()


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
    assert [spec.name for spec in plugin_host.executor_specs()] == ["omega", "zeta", "alpha", "beta"]
    assert [spec.name for spec in plugin_host.executor_specs(only=["beta", "omega"])] == ["omega", "beta"]
    assert [spec.name for spec in plugin_host.executor_specs(exclude=["zeta"])] == ["omega", "alpha", "beta"]


def test_duplicate_executor_names_name_both_providers(fake_dists):
    fake_dists.add("first", GOOD.format(name="same_name", priority=0))
    fake_dists.add("second", GOOD.format(name="same_name", priority=0))
    with pytest.raises(thunderplug.DuplicateRegistrationError) as error:
        thunderplug.discover(host=PluginHost(environ={}))
    assert "fake-first" in str(error.value) and "fake-second" in str(error.value)


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
    records = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in records}
    assert {"name", "status", "reason", "version", "executors"} <= set(by_name["aten_ops"])
    assert by_name["aten_ops"]["executors"] == ["aten"]


def test_cli_table(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["name", "distribution", "version", "status"]
    assert "thunderplug-aten" in out


def test_python_dash_m_entry_point():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "thunderplug", "plugins", "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert any(r["name"] == "aten_ops" for r in json.loads(result.stdout))


@pytest.mark.parametrize("plugin", ["transformer_engine", "nvfuser"])
def test_cuda_plugins_say_why_they_are_unavailable(plugin):
    from thunderplug.availability import cuda_unavailable_reason

    status = {s.name: s for s in thunderplug.report()}[plugin]
    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA is available here; the package check decides")
    assert (status.status, status.reason) == (Status.UNAVAILABLE, reason)


@pytest.mark.requires_cuda
def test_requires_cuda_marker_skips_without_cuda():
    import torch

    assert torch.cuda.is_available()
