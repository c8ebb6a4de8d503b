import pytest
from fake_dists import FakeDistributions


@pytest.fixture
def fake_dists(tmp_path, monkeypatch) -> FakeDistributions:
    return FakeDistributions(tmp_path, monkeypatch)


# --- grad corpus (tests/test_grad_corpus.py): `--long` runs thousands of generated programs ---
def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False, help="run the long generated grad corpus")
