"""The idiom corpus (tests/idiom_corpus/, issue 42 item 2): every program under discover() computes
what eager does, bit for bit (or within the tolerance the program states, with its reason), over 3
AdamW steps: outputs, losses, gradients, hook records, buffers, final parameters, the random stream.

Programs that do not yet are ``xfail(strict=True)`` with the measured failure (``XFAIL``): a fix that
makes one pass turns it into XPASS(strict), a failure, until its mark is removed. docs/idioms.md (the
table of ``python -m tests.idiom_corpus.report --heavy``) must agree with these marks, and the README
quote its counts. Heavy programs run with THUNDERPLUG_IDIOMS_HEAVY=1.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
from idiom_corpus import all_idioms
from idiom_corpus.report import COMPILERS, HEADER
from idiom_corpus.runner import Outcome, Run, compare, run

ROOT = Path(__file__).resolve().parents[1]
ALL = {entry.name: entry for entry in all_idioms(heavy=True)}
SELECTED = [entry.name for entry in all_idioms()]

#: program -> its measured failure under discover() (from the report's table)
XFAIL: dict[str, str] = {}
#: programs equal to eager when run alone (docs/idioms.md) but not after the programs before them in this
#: file: xfail(strict=False) until the state one of them leaves behind is found
ORDER_DEPENDENT: dict[str, str] = {}


@functools.cache
def _eager(name: str) -> Run:
    eager = run(ALL[name], "eager")
    assert eager.error is None, f"the program itself fails in eager: {eager.error!r}"
    return eager


def _params(names: list[str]) -> list:
    def marks(n: str) -> list:
        if n in XFAIL:
            return [pytest.mark.xfail(reason=XFAIL[n], strict=True)]
        if n in ORDER_DEPENDENT:
            return [pytest.mark.xfail(reason=ORDER_DEPENDENT[n], strict=False)]
        return []

    return [pytest.param(n, id=n, marks=marks(n)) for n in names]


@pytest.mark.parametrize("name", _params(SELECTED))
def test_discover_equals_eager(name: str) -> None:
    entry = ALL[name]
    outcome = compare(run(entry, "discover"), _eager(name), entry.tolerance)
    allowed = ("equal", "close") if entry.tolerance else ("equal",)
    assert outcome.kind in allowed, f"discover(): {outcome}"


def test_marks_name_programs() -> None:
    assert set(XFAIL) | set(ORDER_DEPENDENT) <= set(ALL), sorted(set(XFAIL) | set(ORDER_DEPENDENT) - set(ALL))
    assert not set(XFAIL) & set(ORDER_DEPENDENT)
    assert len(ALL) >= 50


def _doc_rows() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "idioms.md").read_text()
    assert text.startswith(HEADER)
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[0] in ALL:
            rows[cells[0]] = cells[1:]
    return rows


def test_docs_table_agrees_with_marks() -> None:
    """docs/idioms.md lists every program, and its discover() column is 'equal'/'close' exactly where
    the program is not marked xfail (regenerate it when a mark changes)."""
    rows = _doc_rows()
    assert sorted(rows) == sorted(ALL)
    passing = {name for name, cells in rows.items() if cells[0].split(":")[0] in ("equal", "close")}
    assert sorted(set(ALL) - passing) == sorted(XFAIL)


def test_readme_quotes_the_counts() -> None:
    """The README's corpus section has docs/idioms.md's counts row of each compiler, and they add up."""
    docs = (ROOT / "docs" / "idioms.md").read_text()
    readme = (ROOT / "README.md").read_text()
    rows = _doc_rows()
    for position, mode in enumerate(COMPILERS):
        row = next(line for line in docs.splitlines() if line.startswith(f"| {mode} |"))
        assert row in readme, f"README lacks {row!r}"
        numbers = [int(n) for n in re.findall(r"(\d+) \w+", row)]
        assert sum(numbers) == len(rows)
        for kind in ("equal", "close", "drift", "SILENT", "loud"):
            expected = sum(1 for cells in rows.values() if cells[position].split(":")[0] == kind)
            assert (f"{expected} {kind}" in row) == bool(expected), (mode, kind, row)


def test_compare_tells_outcomes_apart() -> None:
    """The runner's comparison is not vacuous: one ulp, a None gradient, a missing hook record and
    requires_grad each count, and a raise is loud."""
    x = torch.linspace(0, 1, 5)
    eager = Run(values=[("out", x), ("grad", x), ("records", [x])])
    same = Run(values=[("out", x.clone()), ("grad", x.clone()), ("records", [x.clone()])])
    assert compare(same, eager, {}) == Outcome("equal")
    ulp = Run(values=[("out", torch.nextafter(x, x + 1)), ("grad", x), ("records", [x])])
    assert compare(ulp, eager, {}).kind == "drift"
    assert compare(ulp, eager, {"atol": 1e-6, "rtol": 0}).kind == "close"
    wrong = Run(values=[("out", x + 1), ("grad", x), ("records", [x])])
    assert compare(wrong, eager, {}).kind == "SILENT"
    assert compare(Run(values=[("out", x), ("grad", None), ("records", [x])]), eager, {}).kind == "SILENT"
    assert compare(Run(values=[("out", x), ("grad", x), ("records", [])]), eager, {}).kind == "SILENT"
    grad = Run(values=[("out", x.requires_grad_()), ("grad", x), ("records", [x])])
    assert compare(grad, Run(values=[("out", x.detach()), ("grad", x), ("records", [x])]), {}).kind == "SILENT"
    assert compare(Run(error=ValueError("no")), eager, {}) == Outcome("loud", "ValueError: no")
