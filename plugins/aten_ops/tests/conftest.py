"""``--full``: run every OpInfo sample instead of the first one per OpInfo and dtype."""


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False, help="aten_ops OpInfo tests: run all samples")
