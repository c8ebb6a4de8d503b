import pytest
from fake_dists import FakeDistributions


@pytest.fixture
def no_onednn():
    """oneDNN's CPU fp8 ``_scaled_mm`` takes seconds per small GEMM on AMX CPUs. The flags() context manager, not
    assignment: torch.testing._internal (imported by other tests of the same run) calls
    torch.backends.disable_global_flags(), after which assigning raises."""
    import torch

    with torch.backends.mkldnn.flags(enabled=False):
        yield


@pytest.fixture
def fake_dists(tmp_path, monkeypatch) -> FakeDistributions:
    return FakeDistributions(tmp_path, monkeypatch)


# --- grad corpus (tests/test_grad_corpus.py): `--long` runs thousands of generated programs ---
def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False, help="run the long generated grad corpus")
