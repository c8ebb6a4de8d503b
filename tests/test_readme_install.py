"""The README's one-plugin install, run as written from a fresh clone of this repository.

``python3 -m venv venv`` makes an empty environment; before the ``pip install`` line, the
packages already installed next to this test run (torch, thunder, torchao: gigabytes) are made
visible to it through a ``.pth`` file, so pip finds them satisfied instead of downloading them,
while thunderplug's own distributions are left out: they must come from the clone, through the
README's command. ~1 minute, most of it pip building the two distributions.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_commands() -> list[str]:
    block = re.search(
        r"<!-- one-plugin-install -->\n```bash\n(.*?)```\n<!-- /one-plugin-install -->", README.read_text(), re.DOTALL
    )
    assert block, "README lost its one-plugin-install block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def share_installed_packages(venv: Path, farm: Path) -> None:
    """Everything installed here except thunderplug's distributions, visible to ``venv``."""
    farm.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if re.match(r"(__editable__\.)?_*thunderplug", entry.name) or entry.suffix == ".pth":
            continue
        (farm / entry.name).symlink_to(entry)
    (site_packages,) = (venv / "lib").glob("python3*/site-packages")
    (site_packages / "shared-packages.pth").write_text(f"{farm}\n")


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a git checkout")
def test_one_plugin_install_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("THUNDERPLUG_", "VIRTUAL_ENV", "PYTHONPATH"))}
    commands = readme_commands()
    assert commands[0] == "python3 -m venv venv" and commands[1] == "venv/bin/pip install . ./plugins/float8"
    outputs = []
    for index, command in enumerate(commands):
        if index == 0:
            command = command.replace("python3", sys._base_executable, 1)  # the Python this test runs on
        result = subprocess.run(
            command, shell=True, cwd=clone, env=environ, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        outputs.append(result.stdout)
        if index == 0:
            share_installed_packages(clone / "venv", tmp_path / "shared")
    assert "float8" in outputs[-1] and "active" in outputs[-1]
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == "", "the README's commands leave files git does not ignore"

    python = clone / "venv" / "bin" / "python"
    check = subprocess.run(
        [str(python), "-c", CHECK], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=600, check=False
    )
    assert check.returncode == 0, check.stderr
    report = json.loads(check.stdout)
    assert report["thunderplug_from"].startswith(str(clone / "venv"))  # not this checkout's editable install
    assert report["statuses"]["float8"] == "active" and "aten_ops" not in report["statuses"]
    assert report["executors"][:3] == ["thunderplug", "thunderplug_broadcast_grads", "float8"]
    assert report["max_difference"] == 0.0


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a git checkout")
def test_the_environments_the_readme_creates_are_ignored_by_git():
    """What the README's commands create in the clone (its virtual environments) is not shown as new files."""
    created = [match.group(1) for match in re.finditer(r"-m venv (\S+)", README.read_text())]
    assert "venv" in created
    for folder in created:
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{folder}/"], cwd=ROOT, check=False)
        assert ignored.returncode == 0, f"{folder}/ (created by the README) is not in .gitignore"


CHECK = """
import copy, json
import thunder, torch, thunderplug
from torchao.float8 import convert_to_float8_training
torch.manual_seed(0)
# ReLU, not GELU: with the float8 plugin alone, GELU is thunder's erf formula, within ulps of ATen's kernel
# and equal to it only on some CPUs (8.9e-08 apart on an AMD EPYC); eager's GELU comes with thunderplug-aten
mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
model = convert_to_float8_training(mlp)
jitted = thunder.jit(copy.deepcopy(model), executors=thunderplug.discover(quiet=True))
x = torch.randn(16, 32)
print(json.dumps({
    "thunderplug_from": thunderplug.__file__,
    "statuses": {s.name: s.status.value for s in thunderplug.report()},
    "executors": [e.name for e in thunderplug.discover(quiet=True)],
    "max_difference": (jitted(x) - model(x)).abs().max().item(),
}))
"""
