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
    # issue 35 item 3: where do two unequal cuda:0 devices come from in static-cache generate()? (tiny Llama)
    echo '```'
    timeout 90 $PY - <<'PY' 2>&1 | grep -v Warning | tail -25
import torch, thunder, thunderplug, traceback
from thunder.core import devices, utils
from transformers import LlamaConfig, LlamaForCausalLM
original = utils.check_same_device
def probing(*args, **kwargs):
    try:
        return original(*args, **kwargs)
    except Exception:
        for x in args:
            d = getattr(x, "device", None)
            print("device", repr(d), type(d), type(d).__module__, id(d), "cached:", id(devices.Device._cache.get((d.devicetype, d.index))))
        print("".join(traceback.format_stack(limit=12)))
        raise
utils.check_same_device = probing
torch.manual_seed(0)
config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, vocab_size=256)
model = LlamaForCausalLM(config).cuda().eval()
prompt = torch.randint(0, 256, (1, 8), device="cuda")
expected = model.generate(prompt, max_new_tokens=8, do_sample=False, cache_implementation="static")
model.forward = thunder.jit(model.forward, executors=thunderplug.discover())
try:
    tokens = model.generate(prompt, max_new_tokens=8, do_sample=False, cache_implementation="static")
    print("static-cache generate under discover(): tokens equal eager's:", torch.equal(tokens, expected))
except Exception as error:
    print("static-cache generate under discover() failed:", type(error).__name__, str(error)[:300])
PY
    echo '```'
} >"$REPORT" 2>&1
cat "$REPORT"
