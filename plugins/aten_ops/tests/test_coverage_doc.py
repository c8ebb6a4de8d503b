"""docs/aten_coverage.md is what scripts/aten_coverage.py generates from the committed OpInfo
results (docs/aten_coverage.json), so a registration change or a hand edit cannot go unnoticed.

Cheap on purpose: it re-renders from the JSON (registrations are read live) and never runs the
OpInfo graphs; ``scripts/aten_coverage.py --run`` refreshes the JSON. A second test checks that
the JSON covers the OpInfos the harness would run today.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _script():
    spec = importlib.util.spec_from_file_location("aten_coverage", ROOT / "scripts" / "aten_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_document_is_what_the_script_generates():
    script = _script()
    expected = script.render(json.loads(script.RESULTS.read_text()))
    assert script.DOCUMENT.read_text() == expected, (
        "docs/aten_coverage.md is stale: run `.venv/bin/python scripts/aten_coverage.py` "
        "(add --run to re-run the OpInfo graphs)"
    )


def test_results_cover_every_opinfo_the_harness_runs():
    from opinfo_harness import opinfo_id, opinfos

    results = json.loads(_script().RESULTS.read_text())
    recorded = {case["op_id"] for case in results["cases"]}
    # every in-scope OpInfo of the JSON still exists; and the JSON is not a tiny subset
    assert recorded <= {opinfo_id(op) for op in opinfos()}
    assert len(results["cases"]) > 500
