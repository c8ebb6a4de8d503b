#!/usr/bin/env bash
# GPU checks for a machine with CUDA (run through the device tool when a session is lent one).
# Prints one line per check; writes the full log to ${OUT:-.}/gpu_checks.log.
# Needs: the repository's .venv built by scripts/bootstrap.sh (torch 2.9.1+cu128 wheels run on CUDA).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG="${OUT:-.}/gpu_checks.log"
PY=.venv/bin/python
[ -x "$PY" ] || bash scripts/bootstrap.sh >>"$LOG" 2>&1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0))"
  $PY -m thunderplug plugins
  # 1. tests marked requires_cuda, plus the subclass suites on the GPU-capable install
  $PY -m pytest -q -m requires_cuda -p no:cacheprovider
  # 2. float8 training on CUDA: cuBLASLt _scaled_mm through the unrolled ATen symbol
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
print("executors:", [e.name for e in thunderplug.discover()])
PY
} >"$LOG" 2>&1
status=$?
tail -40 "$LOG"
exit $status
