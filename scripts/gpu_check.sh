#!/usr/bin/env bash
# GPU check for a lent device machine (torch preinstalled, Python 3.12, no package index).
#
#   bash scripts/gpu_check.sh build   # here: pure-Python wheels of thunder, torchao, pluggy and
#                                     # thunderplug into gpu_wheels/ (carried to the device)
#   bash scripts/gpu_check.sh run     # on the device: install the wheels next to the preinstalled
#                                     # torch, run the requires_cuda tests and benchmarks/gpu.py, write
#                                     # the report to $OUT/gpu_report.md and docs/gpu.md's new
#                                     # tables to $OUT/gpu.md (under 8 minutes in all)
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "build" ]; then
    rm -rf gpu_wheels && mkdir gpu_wheels
    .venv/bin/python -m pip wheel --quiet --no-deps -w gpu_wheels . plugins/aten_ops plugins/float8 \
        plugins/transformer_engine plugins/nvfuser lightning-thunder==0.2.6 torchao==0.14.1 pluggy \
        looseversion lightning-utilities opt-einsum dill
    # optree is compiled: the device's Python 3.12 needs its cp312 wheel
    .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 -d gpu_wheels optree
    ls -la gpu_wheels
    exit 0
fi

OUT="${OUT:-.}"
REPORT="$OUT/gpu_report.md"
# GPU_CHECK_PYTHON: an interpreter that has everything already (a dry run of this script on CPU)
PY="${GPU_CHECK_PYTHON:-/tmp/gpu-venv/bin/python}"
if [ -z "${GPU_CHECK_PYTHON:-}" ]; then
    python3 -m venv --system-site-packages /tmp/gpu-venv
    $PY -m pip install --quiet --no-index --no-deps gpu_wheels/*.whl 2>&1 | tail -3
fi
cp docs/gpu.md "$OUT/gpu.md"
{
    echo "# GPU check $(date -u +%Y-%m-%d)"
    echo '```'
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'transformers', transformers.__version__)"
    $PY -m thunderplug plugins
    # the CUDA tests (requires_cuda), the CUDA regions' plan tests and the recipe tests: about 2 minutes
    timeout 180 $PY -m pytest -q -p no:cacheprovider -x -m requires_cuda tests plugins 2>&1 | tail -15
    timeout 120 $PY -m pytest -q -p no:cacheprovider plugins/nvfuser/tests tests/test_recipe.py 2>&1 | tail -5
    echo '```'
    # issue 35's table, one process: training of both models, then greedy generation (about 5 minutes)
    timeout 330 $PY benchmarks/gpu.py --generate --write-docs --docs "$OUT/gpu.md" 2>&1 | grep -v Warning | tail -60
} >"$REPORT" 2>&1
cat "$REPORT"
