#!/usr/bin/env bash
# Set everything up, then run the whole test suite. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit 1
.venv/bin/python -m pytest "$@"
status=$?
# pytest exits 5 when it collected no tests (e.g. a -k filter matching nothing): not a failure.
[ "$status" -eq 5 ] && exit 0
exit "$status"
