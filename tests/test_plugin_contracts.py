"""The plugins of this repository pass thunderplug.testing.PluginContract."""

from thunderplug.testing import PluginContract


class TestAtenOps(PluginContract):
    plugin_name = "aten_ops"


class TestFloat8(PluginContract):
    plugin_name = "float8"
    heavy_modules = ("torchao",)  # claimed by dotted path: discover() never imports torchao


class TestNvfuser(PluginContract):
    plugin_name = "nvfuser"
    heavy_modules = ("nvfuser", "nvfuser_direct")


class TestTransformerEngine(PluginContract):
    plugin_name = "transformer_engine"
    heavy_modules = ("transformer_engine",)
