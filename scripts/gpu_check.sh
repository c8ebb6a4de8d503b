#!/usr/bin/env bash
# GPU check for a lent device machine (torch preinstalled, Python 3.12, no package index).
#
#   bash scripts/gpu_check.sh build   # here: pure-Python wheels of thunder, torchao, pluggy and
#                                     # thunderplug into gpu_wheels/ (carried to the device)
#   bash scripts/gpu_check.sh run     # on the device: install the wheels next to the preinstalled
#                                     # torch, run the requires_cuda tests and a CUDA float8 check,
#                                     # write the report to $OUT/gpu_report.md
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "build" ]; then
    rm -rf gpu_wheels && mkdir gpu_wheels
    .venv/bin/python -m pip wheel --quiet --no-deps -w gpu_wheels . plugins/aten_ops plugins/float8 \
        plugins/transformer_engine plugins/nvfuser lightning-thunder==0.2.6 torchao==0.14.1 pluggy \
        looseversion lightning-utilities optree opt-einsum dill
    ls -la gpu_wheels
    exit 0
fi

OUT="${OUT:-.}"
REPORT="$OUT/gpu_report.md"
python3 -m venv --system-site-packages /tmp/gpu-venv
PY=/tmp/gpu-venv/bin/python
$PY -m pip install --quiet --no-index --no-deps gpu_wheels/*.whl pytest 2>&1 | tail -3
{
    echo "# GPU check $(date -u +%Y-%m-%d)"
    echo '```'
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
    $PY -m thunderplug plugins
    $PY -m pytest -q -p no:cacheprovider -m requires_cuda tests plugins 2>&1 | tail -15
    $PY - <<'PY'
import copy, torch, thunder, thunderplug
from torchao.float8 import convert_to_float8_training
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
eager = convert_to_float8_training(copy.deepcopy(model))
jitted = thunder.jit(convert_to_float8_training(copy.deepcopy(model)), executors=thunderplug.discover())
for step in range(3):
    x, t = torch.randn(256, 1024, device="cuda"), torch.randn(256, 1024, device="cuda")
    le = torch.nn.functional.mse_loss(eager(x), t); le.backward()
    lj = torch.nn.functional.mse_loss(jitted(x), t); lj.backward()
    print(f"cuda float8 step {step}: eager {le.item():.6f} thunderplug {lj.item():.6f}")
PY
    echo '```'
} >"$REPORT" 2>&1
cat "$REPORT"
