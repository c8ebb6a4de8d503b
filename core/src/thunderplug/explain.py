"""``thunderplug.explain(jitted)``: which executor took which op, at which stage, and who declined.

Two stages are shown for the last compilation of ``jitted``:

* before autodiff: each subclass op of the program and the executor whose rule differentiates it
  (a claim, or thunderplug's generic "differentiate the outer op, then unroll");
* execution: each operation of the final forward and backward traces and the executor running it.

Declines come from the claims' checkers (their reason strings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thunderplug.compilation import CompilationRecord, record_of
from thunderplug.specs import Stage
from thunderplug.subclass.symbols import is_subclass_op
from thunderplug.thunder_compat import bound_symbol_printables

_BOOKKEEPING = {"unpack_trivial", "unpack_sequence", "python_return", "python_del", "del", "comment", "return"}


@dataclass(frozen=True)
class Row:
    trace: str  # "forward", "backward" or "program"
    op: str
    executor: str
    stage: str
    declined: tuple[str, ...] = ()  # "executor: reason"


def explain(jitted: Any) -> list[Row]:
    """Rows for the last compilation of a ``thunder.jit`` function or module."""
    import thunder

    record = record_of(jitted)
    traces = thunder.last_traces(jitted)
    if not traces:
        raise ValueError("the function has not been compiled yet: call it once first")
    rows: list[Row] = []
    executors = list(thunder.compile_data(jitted).executors_list)
    for bsym in _walk(traces[0].bound_symbols):
        if is_subclass_op(bsym.sym) and not bsym.sym.name.endswith("_backward"):
            rows.append(_before_autodiff_row(bsym, executors, record))
    backward = thunder.last_backward_traces(jitted)
    for name, trace in (("forward", traces[-1]), ("backward", backward[-1] if backward else None)):
        if trace is None:
            continue
        for bsym in trace.bound_symbols:
            if bsym.sym.name in _BOOKKEEPING or bsym.sym.name.startswith("unpack") or bsym.sym.name.startswith("clear"):
                continue
            rows.append(Row(name, _op_name(bsym), _executor_name(bsym), "execution", _declines_for(bsym.sym.name, record)))
    return rows


def _walk(bsyms: list) -> Any:
    """Bound symbols and, except inside subclass ops, their subsymbols (autograd.Function
    symbols hold the subclass ops of their forward)."""
    for bsym in bsyms:
        yield bsym
        if not is_subclass_op(bsym.sym):
            yield from _walk(bsym.subsymbols)


def _before_autodiff_row(bsym: Any, executors: list, record: CompilationRecord) -> Row:
    target = bsym.sym.name
    display = target
    printed = bsym.sym.python_printer(bsym, *bound_symbol_printables(bsym))
    if isinstance(printed, str) and "= " in printed:
        display = printed.split("= ", 1)[1].split("(", 1)[0]
    for executor in executors:
        if any(f"{name.rsplit('.', 1)[-1]}.apply" == display for name in getattr(executor, "whole_functions", ())):
            return Row("program", display, f"{executor.name} (the Function's own backward)", Stage.BEFORE_AUTODIFF)
    declined = []
    for executor in (ex.name for ex in executors):
        decision = record.latest_decision(executor, display)
        if decision is None:
            continue
        if decision.reason is None:
            return Row("program", display, executor, Stage.BEFORE_AUTODIFF, tuple(declined))
        declined.append(f"{executor}: {decision.reason}")
    return Row("program", display, "thunderplug (autodiff of the outer op, then unrolled)", Stage.BEFORE_AUTODIFF, tuple(declined))


def _declines_for(op_name: str, record: CompilationRecord) -> tuple[str, ...]:
    latest = {(d.executor, d.target): d for d in record.decisions}
    return tuple(
        f"{d.executor}: {d.reason}"
        for d in latest.values()
        if d.reason is not None and d.stage == Stage.AFTER_UNROLLING and d.target.split(".")[-2] in op_name
    )


def _op_name(bsym: Any) -> str:
    if bsym.sym.is_fusion:
        inner = sorted({sub.sym.name for sub in bsym.subsymbols})
        return f"{bsym.sym.name}({', '.join(inner[:6])}{', ...' if len(inner) > 6 else ''})"
    return bsym.sym.name


def _executor_name(bsym: Any) -> str:
    executor = bsym.sym.executor
    if executor is not None:
        return str(executor.name)
    return "python" if bsym.sym.python_impl is not None else "-"


def format_rows(rows: list[Row]) -> str:
    """A readable table: one op per line, declines indented under it."""
    lines = [f"{'trace':<9} {'stage':<16} {'executor':<28} op"]
    for row in rows:
        lines.append(f"{row.trace:<9} {row.stage:<16} {row.executor:<28} {row.op}")
        lines += [f"{'':<9} {'':<16}   declined by {reason}" for reason in row.declined]
    return "\n".join(lines)
