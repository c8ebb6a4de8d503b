"""docs/aten_coverage.md: which ATen overloads the aten_ops plugin registers, how, and which OpInfo
graphs (plugins/aten_ops/tests/opinfo_harness.py) verify them: forward, with inputs that require
grad, and backward.

Two steps, so that the document can be checked cheaply:

    .venv/bin/python scripts/aten_coverage.py --run          # run the OpInfo graphs (first sample per
                                                             # OpInfo, float32 + float64; minutes) and
                                                             # write docs/aten_coverage.json, then the .md
    .venv/bin/python scripts/aten_coverage.py --run --full   # every sample (slow)
    .venv/bin/python scripts/aten_coverage.py                # the .md from the committed .json (seconds)

plugins/aten_ops/tests/test_coverage_doc.py fails when docs/aten_coverage.md is not what the
second form generates (a registration changed, or the .md was edited by hand).
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "aten_coverage.json"
DOCUMENT = ROOT / "docs" / "aten_coverage.md"
STAGES = ("forward", "requires_grad", "backward")

#: overloads no in-scope OpInfo graph reaches but a dedicated test checks against eager (values + gradients)
DEDICATED_TESTS = {
    **{
        key: "plugins/aten_ops/tests/test_nn_kernels.py"
        for key in (
            "convolution_backward.default",
            "native_layer_norm_backward.default",
            "native_group_norm_backward.default",
            "avg_pool2d_backward.default",
            "max_pool2d_with_indices_backward.default",
            "_embedding_bag.default",
            "convolution.default",
            "avg_pool1d.default",
        )
    },
    "_scaled_mm.default": "plugins/aten_ops/tests/test_call_forms.py",
}


#: why an OpInfo graph fails (the failure table's reason column); a failure without one says "unexplained"
REASONS = {
    "nonzero": "refused on purpose: data-dependent output shape (thunder 0.2.6 traces have static shapes)",
    "argwhere": "refused on purpose: argwhere is aten.nonzero (data-dependent output shape)",
}


def core_overloads() -> list[Any]:
    import torch

    found = set()
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        packet = getattr(torch.ops.aten, schema.name[len("aten::") :], None)
        overload = getattr(packet, schema.overload_name or "default", None) if packet is not None else None
        if overload is not None and torch.Tag.core in overload.tags:
            found.add(overload)
    return sorted(found, key=str)


def how_decomposed(decomposition: Any) -> str:
    """'prims', 'ltorch.<fn>' for a table forward, or the thunder torch-fallback symbols it calls
    (torch kernels with a torch vjp)."""
    import thunder.torch as ltorch
    from thunder.core.prims import OpTags

    target = getattr(decomposition, "forwards_to", None)
    target_name = getattr(target, "name", getattr(target, "__name__", None))
    names = {target_name} if target is not None else set(re.findall(r"ltorch\.(\w+)", inspect.getsource(decomposition)))
    fallbacks = sorted(
        n for n in names if OpTags.AUTO_REGISTERED in (getattr(getattr(ltorch, n, None), "tags", None) or ())
    )
    if fallbacks:
        return "torch fallback: " + ", ".join(f"ltorch.{n}" for n in fallbacks)
    return f"forwards to ltorch.{target_name}" if target is not None else "prims"


# -- step 1: run the OpInfo graphs -------------------------------------------------------------------


def run(full: bool) -> dict:
    sys.path.insert(0, str(ROOT / "plugins" / "aten_ops" / "tests"))
    import torch
    from opinfo_harness import DTYPES, EXTRA_PACKETS, opinfo_id, opinfos, run_case

    cases, skipped = [], 0
    for op_id in sorted({opinfo_id(op) for op in opinfos()}):
        for dtype in DTYPES:
            index = 0
            while (case := run_case(op_id, dtype, index)).skip != f"no sample {index}":
                if case.skip is None:
                    cases.append(
                        {
                            "op_id": op_id,
                            "dtype": str(dtype).removeprefix("torch."),
                            "sample": index,
                            "overloads": [f"{o._opname}.{o._overloadname}" for o in case.overloads],
                            "has_requires_grad": case.has_requires_grad,
                            "has_backward": case.has_backward,
                            "errors": case.errors(),
                        }
                    )
                else:
                    skipped += 1
                index += 1
                if not full:
                    break
    return {
        "torch": torch.__version__,
        "full": full,
        "extra_packets": sorted(EXTRA_PACKETS),
        "skipped_samples": skipped,
        "cases": cases,
    }


# -- step 2: the document -------------------------------------------------------------------------------


def render(results: dict) -> str:
    from thunderplug_aten_ops.ops import NOT_REGISTERED, aten_ops

    registered = {f"{op.overload._opname}.{op.overload._overloadname}": op for op in aten_ops()}
    core = [f"{o._opname}.{o._overloadname}" for o in core_overloads()]
    extras = sorted(key for key in registered if key not in set(core))
    cases = results["cases"]
    passed: dict[str, dict[str, set]] = {stage: defaultdict(set) for stage in STAGES}
    failed: dict[str, dict[str, set]] = {stage: defaultdict(set) for stage in STAGES}
    ran = {
        "forward": cases,
        "requires_grad": [c for c in cases if c["has_requires_grad"]],
        "backward": [c for c in cases if c["has_backward"] and "requires_grad" not in c["errors"]],
    }
    for stage in STAGES:
        for case in ran[stage]:
            label = f"{case['op_id']} ({case['dtype']})"
            for key in case["overloads"]:
                (failed if stage in case["errors"] else passed)[stage][key].add(label)

    registered_core = sum(key in registered for key in core)
    refusable = [key for key in core if key not in NOT_REGISTERED]
    lines = [
        "# ATen coverage of the aten_ops plugin",
        "",
        "Generated by `scripts/aten_coverage.py` from `docs/aten_coverage.json` (written by "
        f"`scripts/aten_coverage.py --run{' --full' if results['full'] else ''}`); do not edit by hand. "
        f"torch {results['torch']}. OpInfo graphs: `make_fx` traces of "
        + ("every sample" if results["full"] else "the first sample")
        + " of each OpInfo in float32 and float64 whose ATen ops are all core or in the extra list "
        f"({', '.join(results['extra_packets'])}), run with "
        "`thunder.jit(gm.forward, executors=thunderplug.discover())` "
        "and compared with eager in three stages: forward (inputs without grad), with every floating input "
        "requiring grad (also through ops without derivative: values equal, integer/bool outputs do not require "
        "grad), and backward (input gradients for a random cotangent, `torch.autograd.grad`). Overloads no plugin "
        "registers run through the core's generic fallback (see the docstring of `thunderplug.aten`).",
        "",
        "## Totals",
        "",
        f"* core overloads registered: **{registered_core} / {len(core)}** "
        f"({registered_core} / {len(refusable)} of those not refused on purpose)",
        f"* extra (non-core) overloads registered: {len(extras)}",
    ]
    refused = {key for key in NOT_REGISTERED}
    for stage, title in (
        ("forward", "forward"),
        ("requires_grad", "with inputs requiring grad"),
        ("backward", "backward"),
    ):
        total = len(ran[stage])
        ok = sum(stage not in c["errors"] for c in ran[stage])
        kept = [c for c in ran[stage] if not refused & set(c["overloads"])]
        kept_ok = sum(stage not in c["errors"] for c in kept)
        lines.append(
            f"* OpInfo graphs, {title}: **{ok} / {total}** pass ({100 * ok / max(total, 1):.1f}%); "
            f"without the refused overloads ({', '.join(sorted(refused))}): **{kept_ok} / {len(kept)}** "
            f"({100 * kept_ok / max(len(kept), 1):.1f}%)"
        )
    lines += [
        "",
        "## Failing OpInfo graphs",
        "",
        "| OpInfo | dtype | sample | stage | reason | error |",
        "|---|---|---|---|---|---|",
    ]
    for case in cases:
        for stage, error in case["errors"].items():
            reason = REASONS.get(case["op_id"], "unexplained")
            lines.append(
                f"| {case['op_id']} | {case['dtype']} | {case['sample']} | {stage} | {reason} | "
                f"{error.replace('|', '/')} |"
            )

    def rows(keys: list[str]) -> list[str]:
        out = [
            "| overload | registered | decomposition | forward verified | works with inputs requiring grad "
            "| backward verified | notes |",
            "|---|---|---|---|---|---|---|",
        ]
        for key in keys:
            op = registered.get(key)
            notes = []
            if op is None:
                notes.append(NOT_REGISTERED.get(key, "not registered: runs through the generic fallback"))
            elif not passed["forward"][key] and not failed["forward"][key]:
                notes.append("no in-scope OpInfo graph uses it")
            if op is not None and key in DEDICATED_TESTS:
                notes.append(f"also checked against eager in {DEDICATED_TESTS[key]}")
            for stage in STAGES:
                if failed[stage][key]:
                    notes.append(f"{stage} fails in " + ", ".join(sorted(failed[stage][key])))
            if op is not None and not op.differentiable:
                notes.append(
                    "no derivative: integer/bool outputs take no gradient, a gradient into a float output raises"
                )
            yes = lambda stage: "yes" if passed[stage][key] else "no"  # noqa: E731, B023 - used in this iteration
            out.append(
                f"| `{key}` | {'yes' if op else 'no'} | {how_decomposed(op.decomposition) if op else '-'} | "
                f"{yes('forward')} | {yes('requires_grad')} | {yes('backward')} | {'; '.join(notes)} |"
            )
        return out

    lines += [
        "",
        "## Core overloads",
        "",
        *rows(core),
        "",
        "## Extra overloads (not core-tagged)",
        "",
        *rows(extras),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="run the OpInfo graphs and rewrite the results JSON")
    parser.add_argument("--full", action="store_true", help="with --run: every OpInfo sample, not just the first")
    args = parser.parse_args()
    if args.run:
        RESULTS.write_text(json.dumps(run(args.full), indent=1) + "\n")
    DOCUMENT.write_text(render(json.loads(RESULTS.read_text())))
    print(f"wrote {DOCUMENT}")


if __name__ == "__main__":
    main()
