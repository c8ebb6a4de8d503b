"""``thunderplug.commands.explain(jitted)``: which executor took which op, at which stage, and who declined.

Two stages are shown for the last compilation of ``jitted``:

* before autodiff: each subclass op of the program and the executor whose rule differentiates it
  (a claim, or thunderplug's generic "differentiate the outer op, then unroll");
* execution: each operation of the final forward and backward traces and the executor running it.

Declines come from the claims' checkers (their reason strings). A module that ran another module's
compilation (``thunderplug.caching.reuse``: blocks of one structure compile once) is explained by that
compilation's record; :func:`sharing` says whose it is and how many modules run it. A module
compiled as regions (``thunderplug.caching.regions``) is explained by its regions' rows, in tree order, and a
function broken at a data-dependent op (``thunderplug.wiring.graph_breaks``) by its graphs' rows.
:func:`dynamic_sizes_lines` says which input dimensions a compilation serves symbolically (every size its
guards allow, ``thunderplug.caching.dynamic_sizes``) and why its last call compiled again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thunderplug.caching import dynamic_sizes
from thunderplug.caching.regions import compiled_regions
from thunderplug.caching.reuse import SharedCompilation, shared_compilation_of
from thunderplug.plugin_api.specs import Stage, priority_ahead_of
from thunderplug.subclass.values import is_subclass_op
from thunderplug.thunder_compat import bound_symbol_printables
from thunderplug.tracing.compilation import CompilationRecord, record_of

_BOOKKEEPING = {"unpack_trivial", "unpack_sequence", "python_return", "python_del", "del", "comment", "return"}


GENERIC = "thunderplug (autodiff of the outer op, then unrolled)"
TRACES = ("program", "forward", "backward")


@dataclass(frozen=True)
class Row:
    trace: str  # "forward", "backward" or "program"
    op: str
    executor: str
    stage: str
    declined: tuple[str, ...] = ()  # "executor: reason"
    claimed: bool = False  #: taken by a plugin's claim (its checker accepted)
    fallback: bool = False  #: no plugin rule: thunderplug's generic autodiff, or an unregistered ATen op run as itself


@dataclass(frozen=True)
class Tally:
    """One line of the summary: what one executor did in one trace."""

    trace: str
    executor: str
    ops: int
    claimed: int
    fallbacks: int
    declined: int


def explain(jitted: Any) -> list[Row]:
    """Rows for the last compilation of a ``thunder.jit`` function or module."""
    import thunder

    regions = compiled_regions(jitted)
    if regions:  # compiled as regions (thunderplug.caching.regions): what each ran, in tree order
        return [row for region in regions.values() if thunder.last_traces(region) for row in explain(region)]
    parts = record_of(jitted).graph_parts
    if parts:  # broken at a data-dependent op (thunderplug.wiring.graph_breaks): what each graph ran, in order
        return [row for part in parts if thunder.last_traces(part) for row in explain(part)]
    traces = thunder.last_traces(jitted)
    if not traces:
        raise ValueError("the function has not been compiled yet: call it once first")
    shared = shared_compilation_of(jitted)
    record = shared.record if shared is not None else record_of(jitted)
    rows: list[Row] = []
    compile_data = thunder.compile_data(jitted)
    executors = list(compile_data.executors_list) if compile_data is not None else []
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
            rows.append(_execution_row(name, bsym, record))
    return rows


def _execution_row(trace: str, bsym: Any, record: CompilationRecord) -> Row:
    executor = _executor_name(bsym)
    names = {bsym.sym.name, str(bsym.sym.id)} | {sub.sym.name for sub in bsym.subsymbols}
    accepted = any(
        d.reason is None and d.executor == executor and d.stage == Stage.AFTER_UNROLLING and _same_op(d.target, names)
        for d in record.decisions
    )
    unprefixed = {name.removeprefix("fallback_") for name in names}  # fallback operators: fallback_aten_abs_default
    fallback = bool(names & record.fallbacks) or any(
        _same_op(name, names) or _same_op(name, unprefixed) for name in record.fallbacks
    )
    return Row(trace, _op_name(bsym), executor, "execution", _declines_for(bsym.sym.name, record), accepted, fallback)


def _same_op(qualified: str, names: set[str]) -> bool:
    """``torch.ops.aten.add.Tensor`` is printed ``aten_add_Tensor`` in execution traces."""
    parts = qualified.split(".")
    return qualified in names or (len(parts) >= 4 and "_".join(parts[-3:]) in names)


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
            return Row(
                "program",
                display,
                f"{executor.name} (the Function's own backward)",
                Stage.BEFORE_AUTODIFF,
                claimed=True,
            )
    declined: list[str] = []
    for executor in (ex.name for ex in executors):
        decision = record.latest_decision(executor, display)
        if decision is None:
            continue
        if decision.reason is None:
            return Row("program", display, executor, Stage.BEFORE_AUTODIFF, tuple(declined), claimed=True)
        declined.append(f"{executor}: {decision.reason}")
    return Row("program", display, GENERIC, Stage.BEFORE_AUTODIFF, tuple(declined), fallback=True)


def unused_kernel_claims(
    jitted: Any, rows: list[Row], priorities: Mapping[str, int] | None = None, *, absent: bool = False
) -> list[str]:
    """Why an ``AtenKernelClaim`` of the compilation's executors ran on nothing, one line per claim:
    shadowed by an executor ahead of it (``priorities``, by executor name, give the fix), or
    decomposed by autodiff; with ``absent``, also each claim whose overload is nowhere in the program
    (usually a plugin's claim on ops this program does not use)."""
    import thunder

    parts = record_of(jitted).graph_parts
    if parts:  # broken at a data-dependent op: its graphs' notes, each once
        notes_of_parts = (
            unused_kernel_claims(part, rows, priorities, absent=absent) for part in parts if thunder.last_traces(part)
        )
        return list(dict.fromkeys(note for notes in notes_of_parts for note in notes))
    compile_data = thunder.compile_data(jitted)
    executors = list(compile_data.executors_list) if compile_data is not None else []
    record = record_of(jitted)
    program = thunder.last_traces(jitted)[0].bound_symbols
    notes = []
    for executor in executors:
        for claim in getattr(executor, "kernel_claims", ()):
            declined = any(
                d.executor == executor.name and d.target == claim.target and d.reason is not None
                for d in record.decisions
            )
            ran = any(row.executor == executor.name and claim.overload._opname in row.op for row in rows)
            if declined or ran:  # a declined claim is shown with its reason
                continue
            takers = dict.fromkeys(r.executor for r in rows if r.trace != "program" and _same_op(claim.target, {r.op}))
            if takers:
                notes.append(
                    f"{executor.name}: its claim on {claim.target} never ran: shadowed by executor "
                    f"{', '.join(map(repr, takers))}, ahead of it in the executor list; "
                    f"{_priority_hint(next(iter(takers)), priorities or {})} on the claim to run first"
                )
            elif any(str(bsym.sym.id) == claim.target for bsym in _walk(program)):
                notes.append(
                    f"{executor.name}: its claim on {claim.target} never ran: the program calls it directly and "
                    "computes gradients, so thunder's autodiff decomposed it before executors were asked (an "
                    "AtenKernelClaim takes direct torch.ops.aten calls only without gradients; docs/claims.md)"
                )
            elif absent:
                notes.append(
                    f"{executor.name}: its claim on {claim.target} never ran: no {claim.target} in the traces (an "
                    "AtenKernelClaim takes the ATen ops of unrolled subclass ops and direct torch.ops.aten calls "
                    "without gradients, not torch-level calls such as torch.mm or F.linear; docs/claims.md)"
                )
    return notes


def _priority_hint(executor: str, priorities: Mapping[str, int]) -> str:
    if executor not in priorities:
        return "give its executor a priority that lists it first"
    return f"set priority={priority_ahead_of(priorities[executor])}"


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


@dataclass(frozen=True)
class Sharing:
    """The compilation a jitted module's last call ran, when modules of its structure share it."""

    owner: str  # the module it was compiled for
    own: bool  # whether that is this module
    reuses: int  # how many other modules run it

    def line(self, name_of_owner: str | None = None, what: str = "modules") -> str:
        users = f"{self.reuses} other {what if self.reuses != 1 else what[:-1]}"
        if self.own:
            return f"compiled here; run by {users} of the same structure without compiling"
        return f"runs the compilation of {name_of_owner or self.owner} (shared with {users}): no compilation of its own"


def sharing(jitted: Any) -> Sharing | None:
    """Whose compilation ``jitted``'s last call ran, if it is shared (``None``: its own, unshared)."""
    shared: SharedCompilation | None = shared_compilation_of(jitted)
    if shared is None or (shared.reuses == 0 and shared.record is record_of(jitted)):
        return None
    return Sharing(shared.owner, shared.record is record_of(jitted), shared.reuses)


def summarize(rows: list[Row]) -> list[Tally]:
    """Per trace (program, forward, backward), per executor: ops taken, by a claim, as a fallback,
    and how many ops its checkers declined."""
    tallies = []
    for trace in TRACES:
        in_trace = [row for row in rows if row.trace == trace]
        executors = dict.fromkeys(row.executor for row in in_trace)  # first-seen order
        decliners = dict.fromkeys(reason.split(":", 1)[0] for row in in_trace for reason in row.declined)
        for executor in [*executors, *(d for d in decliners if d not in executors)]:
            taken = [row for row in in_trace if row.executor == executor]
            declined = sum(any(r.split(":", 1)[0] == executor for r in row.declined) for row in in_trace)
            claimed, fallbacks = sum(row.claimed for row in taken), sum(row.fallback for row in taken)
            tallies.append(Tally(trace, executor, len(taken), claimed, fallbacks, declined))
    return tallies


LEGEND = """\
ops: the trace's operations the executor runs; claimed: of those, taken by a plugin's claim (its checker
accepted); fallback: of those, run with no plugin's rule for them (in forward/backward, an ATen overload no
active plugin registers, run as one eager call; before autodiff, a subclass op differentiated by thunderplug's
generic rule); declined: ops this executor's checkers declined (reasons with --all)"""


def fallback_hint(rows: list[Row], executors: list[str]) -> str | None:
    """What to do when ATen ops ran through the fallback, or ``None`` when none did."""
    ran = sorted({row.op for row in rows if row.fallback and row.trace != "program"})
    if not ran:
        return None
    ops = ", ".join(op.removeprefix("fallback_") for op in ran[:8]) + (", ..." if len(ran) > 8 else "")
    if "aten" not in executors:
        return (
            f"{len(ran)} ATen overload(s) ran through the fallback ({ops}): install thunderplug-aten "
            "(pip install ./plugins/aten_ops) to give them decompositions fusers can take and run the rest as "
            "single ATen calls"
        )
    return (
        f"{len(ran)} ATen overload(s) no active plugin registers ran through the fallback ({ops}); a plugin can "
        "register them with register_aten_ops (docs/hooks.md, docs/aten_coverage.md)"
    )


def format_summary(rows: list[Row], *, legend: bool = False) -> str:
    """The summary table (with the legend of its columns when ``legend``), then the before-autodiff
    decisions (usually few, and the interesting ones)."""
    tallies = summarize(rows)
    width = max([len(t.executor) for t in tallies] + [len("executor")])
    lines = [f"{'trace':<9} {'executor':<{width}} {'ops':>5} {'claimed':>8} {'fallback':>9} {'declined':>9}"]
    lines += [
        f"{t.trace:<9} {t.executor:<{width}} {t.ops:>5} {t.claimed:>8} {t.fallbacks:>9} {t.declined:>9}"
        for t in tallies
    ]
    if legend:
        lines += ["", LEGEND]
    program = [row for row in rows if row.trace == "program"]
    if program:
        lines += ["", "before autodiff (who differentiates each subclass op):"]
        counts: dict[tuple, int] = {}
        for row in program:  # one line per distinct decision, with how many ops it covers
            key = (row.op, row.executor, row.declined)
            counts[key] = counts.get(key, 0) + 1
        for (op, executor, declined), count in counts.items():
            lines.append(f"  {op:<40} {executor}" + (f" (x{count})" if count > 1 else ""))
            lines += [f"  {'':<40}   declined by {reason}" for reason in declined]
    return "\n".join(lines)


def format_rows(rows: list[Row]) -> str:
    """A readable table: one op per line, declines indented under it."""
    width = max([len(row.executor) for row in rows] + [len("executor")])
    lines = [f"{'trace':<9} {'stage':<16} {'executor':<{width}} op"]
    for row in rows:
        lines.append(f"{row.trace:<9} {row.stage:<16} {row.executor:<{width}} {row.op}")
        lines += [f"{'':<9} {'':<16}   declined by {reason}" for reason in row.declined]
    return "\n".join(lines)


def dynamic_sizes_lines(jitted: Any) -> list[str]:
    """Lines on the symbolic input dimensions of a ``thunder.jit`` function or region: compilations and
    re-specializations, the dims served symbolically with the relations guarded, the dims that had to be
    specialized and why, and why the last call compiled in full. Empty when no dim was ever tracked."""
    import thunder

    try:
        found = dynamic_sizes.summary(thunder.compile_data(jitted))
    except Exception:  # noqa: BLE001 - not a thunder.jit function
        return []
    if found is None:
        return []
    lines = [f"symbolic sizes: {found.full} full compilation(s), {found.respecialized} re-specialized for new sizes"]
    if found.symbolic:
        lines.append("  symbolic: " + ", ".join(found.symbolic) + " (every size the guards allow)")
        lines += [f"    guard: {guard}" for guard in found.guards]
    lines += [f"  specialized: {why}" for why in found.specialized]
    if found.last_reason:
        lines.append(f"  last compiled again: {found.last_reason}")
    return lines
