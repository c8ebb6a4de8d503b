#!/usr/bin/env bash
# Create .venv if it is missing and install the core, every plugin and the test tools into it.
# Needs only python3 (3.11) and access to PyPI. Safe to re-run: pip skips what is installed.
# The default environment is torch 2.9.1, torchao 0.14.1 and torchvision 0.24.1 (the release built for torch
# 2.9.1, pinned with it so that timm's requirement cannot move torch: tests/real_models' resnet18, mobilenets
# and timm model import it); the packages declare the measured ranges (README, "Torch versions";
# scripts/compat.sh builds an environment with another torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet \
    'torch==2.9.1' 'torchao==0.14.1' 'torchvision==0.24.1' \
    -e '.[test]' \
    -e plugins/aten_ops \
    -e plugins/float8 \
    -e plugins/transformer_engine \
    -e plugins/nvfuser
# litgpt's model code for tests/real_models: its own requirements pin numpy<2 (torch's numpy stays)
.venv/bin/python -m pip install --quiet --no-deps 'litgpt==0.5.9'
