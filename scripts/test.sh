#!/usr/bin/env bash
# Set everything up, then run the whole test suite. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit 1
# Lint (ruff's rule selection in pyproject.toml) and type-check the core's public API first: cheap.
.venv/bin/ruff check core plugins tests benchmarks scripts || exit 1
.venv/bin/mypy || exit 1
.venv/bin/python -m pytest "$@"
status=$?
# pytest exits 5 when it collected no tests (e.g. a -k filter matching nothing): not a failure.
[ "$status" -eq 5 ] && exit 0
exit "$status"
