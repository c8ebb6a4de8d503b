"""The README's example plugin, installed as a distribution and found by discover()."""

import re
from pathlib import Path

import thunder
import torch

import thunderplug
from thunderplug import PluginHost, Status

README = Path(__file__).resolve().parents[1] / "README.md"


def example_source() -> str:
    block = re.search(
        r"<!-- example-plugin -->\n```python\n(.*?)```\n<!-- /example-plugin -->", README.read_text(), re.DOTALL
    )
    assert block, "README lost its example plugin block"
    return block.group(1)


def test_example_is_about_twenty_lines():
    assert len(example_source().strip().splitlines()) <= 26


def test_readme_example_plugin_is_discovered_and_used(fake_dists):
    import importlib

    fake_dists.add("hello", example_source(), module="hello_thunderplug")
    host = PluginHost(environ={})
    status = {s.name: s for s in host.report()}["hello"]
    assert (status.status, status.executors) == (Status.ACTIVE, ["hello_silu"])

    executors = thunderplug.discover(host=host)
    assert "hello_silu" in [ex.name for ex in executors]
    jitted = thunder.jit(lambda x: torch.nn.functional.silu(x) * 2, executors=executors)
    x = torch.randn(4, 8)
    torch.testing.assert_close(jitted(x), torch.nn.functional.silu(x) * 2)
    assert importlib.import_module("hello_thunderplug").calls == 1
