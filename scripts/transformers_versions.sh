#!/usr/bin/env bash
# scripts/transformers_versions.sh [VERSION...] [-- PYTEST_ARGS...]
#
# The real-model corpus under other transformers releases (issue 36 item 2). For each VERSION (default: the
# oldest and newest releases the test extra admits, and 4.57.6) it builds .compat/transformers-VERSION/
# (gitignored): a venv holding that transformers and the dependencies it needs in other versions than .venv's
# (transformers 4: huggingface_hub<1, tokenizers), with the project's .venv on its path through a .pth file, so
# torch, thunder, torchao, litgpt and this checkout's editable packages are the project's own. .venv itself is
# never changed. Then it runs PYTEST_ARGS
# (default: tests/real_models/test_real_models.py, the default selection; THUNDERPLUG_REAL_MODELS=1 for all)
# and prints one line per version: "transformers V: <pytest's summary>". Exits non-zero if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
versions=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do versions+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
tests=("$@")
[ ${#tests[@]} -eq 0 ] && tests=(tests/real_models/test_real_models.py)
[ ${#versions[@]} -eq 0 ] && versions=(5.23.0 5.25.0 4.57.6)
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") || exit 1
base=$(.venv/bin/python -c "import sys; print(sys.base_prefix)")/bin/python3
root=$(pwd)
status=0
summary=()
for version in "${versions[@]}"; do
    env=".compat/transformers-$version"
    if [ ! -x "$env/bin/python" ]; then
        "$base" -m venv "$env" || exit 1
        envsite=$("$env/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        printf '%s\n' "$site" "$root/core/src" "$root/plugins/aten_ops/src" "$root/plugins/float8/src" \
            "$root/plugins/nvfuser/src" "$root/plugins/transformer_engine/src" > "$envsite/project_venv.pth"
        # pip sees .venv's packages through the .pth file: only what that release needs in other versions
        # (transformers 4's huggingface_hub<1 and tokenizers, requests) is installed here, ahead of .venv's
        "$env/bin/python" -m pip install -q "transformers==$version" 2>&1 | grep -v "^WARNING: Location" \
            | grep -Ev "dependency resolver|^[a-z0-9_.-]+ [0-9.]+ requires " ; \
            [ "${PIPESTATUS[0]}" -eq 0 ] || { rm -rf "$env"; exit 1; }
    fi
    "$env/bin/python" -c "import transformers, thunderplug; assert transformers.__version__ == '$version'" || exit 1
    log="$env/pytest.log"
    PYTHONPATH="$root" "$env/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}" > "$log" 2>&1
    run=$?
    [ "$run" -ne 0 ] && status=1
    summary+=("transformers $version: $(tail -n 1 "$log")")
done
printf '%s\n' "${summary[@]}"
exit "$status"
