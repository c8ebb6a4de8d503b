import pytest

from fake_dists import FakeDistributions


@pytest.fixture
def fake_dists(tmp_path, monkeypatch) -> FakeDistributions:
    return FakeDistributions(tmp_path, monkeypatch)
