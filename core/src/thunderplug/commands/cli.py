"""The ``thunderplug`` command (also ``python -m thunderplug``)."""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import traceback
from dataclasses import asdict
from typing import Any

DESCRIPTION = """\
Plugin-based executors for lightning-thunder, with tensor-subclass support.
In Python: thunder.jit(model, executors=thunderplug.discover()).
"""

EPILOG = """\
environment:
  THUNDERPLUG_PLUGINS=a,b   load only these plugins (empty: none of the installed ones)
  THUNDERPLUG_DISABLE=a,b   block these plugins (shown as disabled)
  THUNDERPLUG_STRICT=1      re-raise plugin errors instead of reporting them
  THUNDERPLUG_QUIET=1       no warning about broken plugins
"""


def _plugins(args: argparse.Namespace) -> int:
    import thunderplug
    from thunderplug.host.discovery import default_host
    from thunderplug.plugin_api.report import ExecutorEntry, format_executor_order, format_table

    statuses = thunderplug.report()
    host = default_host()
    executors = [str(executor.name) for executor in thunderplug.discover(quiet=True)]
    specs = {spec.name: spec for spec in host.executor_specs()}
    shadowed = host.shadowed_claims(list(specs.values()))
    builtin = {s.name for s in statuses if s.builtin}

    def provided_by(plugin: str | None) -> str:
        return "thunderplug (built in)" if plugin in builtin else f"plugin {plugin}"

    entries = [
        ExecutorEntry(
            name,
            provided_by(host.provider_of(name)),
            specs[name].priority,
            specs[name].description,
            tuple(shadowed.get(name, ())),
        )
        if name in specs
        else ExecutorEntry(name, "thunder", None, "one of thunder's own default executors")
        for name in executors
    ]
    if args.json:
        report = {
            "plugins": [s.to_json() for s in statuses],
            "executors": executors,
            "executor_details": [asdict(entry) for entry in entries],
        }
        print(json.dumps(report, indent=2))
    else:
        print(format_table(statuses))
        print(f"\ndiscover() returns, in this order: {', '.join(executors)}\n")
        print(format_executor_order(entries))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from thunderplug.commands.demo import run_demo

    return run_demo(steps=args.steps, plot=args.plot, progress=not args.no_progress)


def _explain(args: argparse.Namespace) -> int:
    """Run a script as ``__main__``, whatever way it ends, then explain every function it compiled.
    A function compiled as regions (``thunderplug.caching.regions``: a model's repeated blocks, DDP, FSDP2)
    lists its regions and which of them ran another one's compilation, then explains each region
    that compiled (all of them with ``--all``)."""
    from thunderplug.caching.regions import compiled_regions
    from thunderplug.commands.explain import LEGEND, explain, summarize
    from thunderplug.tracing.compilation import record_of
    from thunderplug.wiring.patches import recording_jitted_functions

    exit_code, error = 0, None
    argv = sys.argv
    with recording_jitted_functions() as jitted_functions:
        sys.argv = [args.script, *args.script_args]
        try:
            runpy.run_path(args.script, run_name="__main__")
        except SystemExit as stop:
            exit_code = _exit_code(stop.code)
        except Exception as raised:  # noqa: BLE001 - the user's script raised: report it and what was compiled
            exit_code, error = 1, f"{type(raised).__name__}: {raised}"
            traceback.print_exc()
        finally:
            sys.argv = argv
    regions_of = {
        id(fn): {path: region for path, region in compiled_regions(fn).items() if _was_compiled(region)}
        for fn in jitted_functions
    }
    inside = {id(region) for regions in regions_of.values() for region in regions.values()}
    inside |= {id(part) for fn in jitted_functions for part in record_of(fn).graph_parts}
    compiled = [fn for fn in jitted_functions if _was_compiled(fn) and id(fn) not in inside]
    names = _compilation_names(compiled, regions_of)
    shares = [_share(fn) for fn in compiled]
    ending = f"raised {error}" if error else f"exited with code {exit_code}"
    adopters = sum(share is not None and not share.own for share in shares)
    reusing = f" ({adopters} of them ran the compilation of a module of the same structure)" if adopters else ""
    if args.json:
        def entry(fn: Any, **fields: Any) -> dict[str, Any]:
            share = _share(fn)
            rows = _rows(explain, fn)
            return {
                **fields,
                "shared": None if share is None else {
                    **asdict(share), "owner_index": _index_of(owner := names.get(share.owner)), "owner_name": owner
                },
                "graph_break": record_of(fn).graph_break.strip() or None,
                "summary": [asdict(t) for t in summarize(rows)],
                "rows": [asdict(r) for r in rows],
                "notes": _notes(fn, rows, every_claim=True),
            }

        functions = []
        for index, fn in enumerate(compiled):
            regions = regions_of[id(fn)]
            if regions:
                functions.append({"index": index, "name": _name(fn), "regions": [
                    entry(region, path=path, name=_name(region)) for path, region in regions.items()
                ]})
            else:
                functions.append(entry(fn, index=index, name=_name(fn)))
        report = {"script": args.script, "exit_code": exit_code, "error": error, "functions": functions}
        print(json.dumps(report, indent=2))
        return exit_code or (0 if compiled else 1)
    print(f"thunderplug explain: {args.script} {ending}; {len(compiled)} thunder.jit function(s) compiled{reusing}")
    for index, fn in enumerate(compiled):
        print(f"\n== thunder.jit function {index}: {_name(fn)} ==")
        regions = regions_of[id(fn)]
        if not regions:
            _explain_one(fn, shares[index], names, args)
            continue
        print(f"compiled as {len(regions)} regions (the code around them runs eagerly):")
        width = max(len(path) for path in regions)
        for path, region in regions.items():
            share = _share(region)
            line = "compiled here" if share is None else share.line(names.get(share.owner), "regions")
            print(f"  {path:<{width}}  {_name(region)}: {line}")
        for path, region in regions.items():
            share = _share(region)
            if share is not None and not share.own and share.owner in names and not args.all:
                continue  # its summary is its owner's
            print(f"\n== region {path} ({_name(region)}) of function {index} ==")
            _explain_one(region, None, names, args)
    if compiled:
        print(f"\n{LEGEND}")
    if compiled and not args.all:
        print("\n(--all lists every op of every trace; --json prints all of it as JSON)")
    return exit_code or (0 if compiled else 1)


def _share(fn: Any) -> Any:
    from thunderplug.commands.explain import sharing

    return sharing(fn)


def _compilation_names(compiled: list[Any], regions_of: dict[int, dict[str, Any]]) -> dict[str, str]:
    """How ``explain`` names the owner of each shared compilation: "function 3" or "region blocks.0"
    (of function 3, when it is another function's)."""
    names: dict[str, str] = {}
    for index, fn in enumerate(compiled):
        for path, region in regions_of[id(fn)].items():
            share = _share(region)
            if share is not None and share.own:
                names[share.owner] = f"region {path}" + (f" of function {index}" if len(compiled) > 1 else "")
        share = _share(fn)
        if share is not None and share.own:
            names[share.owner] = f"function {index}"
    return names


def _index_of(name: str | None) -> int | None:
    return int(name.split()[1]) if name is not None and name.startswith("function ") else None


def _explain_one(fn: Any, share: Any, names: dict[str, str], args: argparse.Namespace) -> None:
    """The summary of one compiled function or region (with its sharing line when ``share``)."""
    from thunderplug.commands.explain import dynamic_sizes_lines, explain, format_rows, format_summary
    from thunderplug.tracing.compilation import record_of

    if share is not None:
        owner = names.get(share.owner)
        print(share.line(owner))
        if not share.own and owner is not None and not args.all:
            return  # its summary is its owner's
    record = record_of(fn)
    if record.graph_parts:
        print(
            f"graph broken at{record.graph_break} (a data-dependent output shape): {len(record.graph_parts)} "
            "graph(s) compiled by thunder.jit, the op and the code between them run eagerly"
        )
    sizes = dynamic_sizes_lines(fn)
    if sizes:
        print("\n".join(sizes))
    rows = _rows(explain, fn)
    print(format_summary(rows) if rows else "(nothing to explain: see the error above)")
    notes = _notes(fn, rows, every_claim=args.all)
    if notes:
        print("\nnotes:")
        print("\n".join(f"  {note}" for note in notes))
    if args.all:
        print()
        print(format_rows(rows))


def _rows(explain: Any, fn: Any) -> list[Any]:
    """``explain(fn)``, or no rows and the error on stderr: one function must not hide the others."""
    try:
        return list(explain(fn))
    except Exception as error:  # noqa: BLE001 - report it and go on with the next function
        print(f"thunderplug explain: cannot explain {_name(fn)}: {type(error).__name__}: {error}", file=sys.stderr)
        return []


def _notes(fn: Any, rows: list[Any], *, every_claim: bool = False) -> list[str]:
    """The fallback hint and the kernel claims that ran on nothing, with why (``every_claim``: also
    those whose op is nowhere in the program)."""
    import thunder

    from thunderplug.commands.explain import fallback_hint, unused_kernel_claims
    from thunderplug.host.discovery import default_host

    if not rows:
        return []
    compile_data = thunder.compile_data(fn)
    executors = [str(ex.name) for ex in compile_data.executors_list] if compile_data is not None else []
    priorities = {spec.name: spec.priority for spec in default_host().executor_specs()}
    hint = fallback_hint(rows, executors)
    return ([hint] if hint else []) + unused_kernel_claims(fn, rows, priorities, absent=every_claim)


def _exit_code(code: Any) -> int:
    """What the interpreter would exit with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _name(fn: Any) -> str:
    inner = getattr(fn, "_model", None) or getattr(fn, "__wrapped__", None) or fn
    return getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or type(inner).__name__


def _was_compiled(fn: Any) -> bool:
    import thunder

    from thunderplug.tracing.compilation import record_of

    try:
        return bool(record_of(fn).graph_parts) or bool(thunder.last_traces(fn))
    except Exception:  # noqa: BLE001 - never called: nothing to explain
        return False


def build_parser() -> argparse.ArgumentParser:
    from thunderplug.plugin_api.version import __version__

    parser = argparse.ArgumentParser(
        prog="thunderplug",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"thunderplug {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")

    plugins = commands.add_parser(
        "plugins",
        help="installed plugins: status and why, hooks, module, and the executor order discover() returns",
        description="Every plugin discover() considers (thunderplug's own first), its status and why, the hooks "
        "it implements, where they live, and the executors discover() returns, in order.",
    )
    plugins.add_argument("--json", action="store_true", help="print JSON (plugins, executor order)")
    plugins.set_defaults(run=_plugins)

    explain = commands.add_parser(
        "explain",
        help="run a script, then summarize which executor took each op of every function it compiled",
        description="Run SCRIPT as __main__ (even if it calls sys.exit or raises), then summarize, for each "
        "thunder.jit function it compiled, which executor took which op: per trace and executor, ops taken, "
        "by a claim, as a fallback, and declines. Exits with the script's exit code.",
    )
    explain.add_argument("--all", action="store_true", help="also list every op of every trace")
    explain.add_argument("--json", action="store_true", help="print the summary and every op as JSON")
    explain.add_argument("script", help="the Python script to run")
    explain.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    explain.set_defaults(run=_explain)

    demo = commands.add_parser(
        "demo",
        help="train a small float8 GPT with discover() next to eager PyTorch (under a minute)",
        description="Train a small torchao float8 GPT on a fixed batch: fp32 eager, fp8 eager and fp8 under "
        "thunder.jit(executors=discover()); print the losses, median step times with their spread and the "
        "first call apart, what was compiled, and the agreement with eager.",
    )
    demo.add_argument("--steps", type=int, default=15, help="training steps (default: 15)")
    demo.add_argument(
        "--plot", metavar="PNG", help="write losses and step times to this PNG (needs matplotlib; checked first)"
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
