#!/usr/bin/env bash
# scripts/compat.sh TORCH_VERSION [TORCHAO_VERSION] [-- PYTEST_ARGS...]
#
# Does thunderplug work with another torch (and torchao)? Builds a separate environment,
# .compat/torch-T-torchao-A/ (gitignored; the default .venv is left alone), with that torch,
# lightning-thunder 0.2.6 and torchao (default 0.14.1), installs this checkout's core and plugins
# into it without letting their pins replace that torch, then runs the core and float8 tests
# (or PYTEST_ARGS). Prints one line at the end: "compat torch T torchao A: <pytest's summary>".
# A torch that thunder 0.2.6 cannot import fails at the first step, with thunder's error.
set -uo pipefail
cd "$(dirname "$0")/.."
torch_version=${1:?usage: scripts/compat.sh TORCH_VERSION [TORCHAO_VERSION] [-- PYTEST_ARGS...]}
shift
torchao_version=0.14.1
if [ $# -gt 0 ] && [ "$1" != "--" ]; then torchao_version=$1; shift; fi
[ "${1:-}" = "--" ] && shift
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
    tests=(tests/test_discovery.py tests/test_claims.py tests/test_subclass_inference.py
           tests/test_subclass_training.py tests/test_float8_inference.py tests/test_float8_training.py
           tests/test_gpt_float8.py)
fi
env=".compat/torch-$torch_version-torchao-$torchao_version"
python=${PYTHON:-python3}
if [ ! -x "$env/bin/python" ]; then
    "$python" -m venv "$env" || exit 1
    # torch and torchao first and pinned; thunder's own dependencies (not torch) follow it
    "$env/bin/python" -m pip install -q "torch==$torch_version" "torchao==$torchao_version" \
        "lightning-thunder==0.2.6" "pluggy>=1.5" pytest expecttest hypothesis || { rm -rf "$env"; exit 1; }
fi
# this checkout, every time (its code changes, the environment does not), without its pins
# (torch, torchao) replacing the ones above
"$env/bin/python" -m pip install -q --no-deps --force-reinstall . ./plugins/aten_ops ./plugins/float8 \
    ./plugins/nvfuser ./plugins/transformer_engine || exit 1
unset PYTHONPATH  # the installed copies, not a worktree's sources (scripts/env.sh-style setups set it)
"$env/bin/python" -c "import thunderplug, torch, torchao, thunder; thunderplug.discover(quiet=True); \
print('torch', torch.__version__, 'torchao', torchao.__version__, 'thunder', thunder.__version__)" || exit 1
log="$env/pytest.log"
"$env/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}" 2>&1 | tee "$log" | tail -n 30
status=${PIPESTATUS[0]}
echo "compat torch $torch_version torchao $torchao_version: $(tail -n 1 "$log")"
exit "$status"
