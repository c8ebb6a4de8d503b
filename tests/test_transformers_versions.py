"""The real-model corpus's default selection under the other transformers releases the test extra admits.

The test run itself has the newest release the extra admits (pip resolves it); this runs
``scripts/transformers_versions.sh`` for the oldest one and for transformers 4.57.6, each in its own
``.compat/transformers-V`` overlay of the project's environment (only transformers and what that release needs in
other versions differ). About 2 minutes a release on 2 CPU cores, most of it the tests; the overlay is built once.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
transformers = pytest.importorskip("transformers")


def admitted_range() -> tuple[str, str]:
    """The lower and upper bounds of transformers in the ``test`` extra of pyproject.toml."""
    spec = re.search(r'"transformers>=([\d.]+),<([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert spec, "pyproject.toml's test extra lost its transformers range"
    return spec.group(1), spec.group(2)


def test_the_environment_has_a_release_the_extra_admits():
    from packaging.version import Version

    low, high = admitted_range()
    assert Version(low) <= Version(transformers.__version__) < Version(high)


@pytest.mark.skipif(".compat" in sys.prefix, reason="already inside an overlay of scripts/transformers_versions.sh")
@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "python").exists(), reason="needs the project's .venv")
@pytest.mark.parametrize("version", [f"{admitted_range()[0]}.0", "4.57.6"])
def test_real_models_under_transformers(version):
    environ = {k: v for k, v in os.environ.items() if k != "THUNDERPLUG_REAL_MODELS"}  # the default selection
    result = subprocess.run(["bash", "scripts/transformers_versions.sh", version], cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=1200, check=False)
    log = ROOT / ".compat" / f"transformers-{version}" / "pytest.log"
    details = log.read_text()[-6000:] if log.exists() else result.stderr[-6000:]
    assert result.returncode == 0, f"{result.stdout}\n{details}"
    assert re.search(rf"transformers {re.escape(version)}: \d+ passed", result.stdout), result.stdout
