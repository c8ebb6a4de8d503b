"""``thunderplug`` command line: ``plugins`` (what is installed and why) and ``demo``."""

from __future__ import annotations

import argparse
import json
import sys


def _plugins(args: argparse.Namespace) -> int:
    import thunderplug
    from thunderplug.report import format_table

    statuses = thunderplug.report()
    if args.json:
        print(json.dumps([s.to_json() for s in statuses], indent=2))
    else:
        print(format_table(statuses))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from thunderplug.demo import run_demo

    return run_demo(steps=args.steps, plot=args.plot)


def _explain(args: argparse.Namespace) -> int:
    """Run a script, then explain every thunder.jit function it compiled."""
    import runpy

    from thunderplug.explain import explain, format_rows
    from thunderplug.thunder_compat.patches import recording_jitted_functions

    with recording_jitted_functions() as jitted_functions:
        sys.argv = [args.script, *args.script_args]
        runpy.run_path(args.script, run_name="__main__")
    compiled = [fn for fn in jitted_functions if _was_compiled(fn)]
    if not compiled:
        print(f"{args.script} compiled no thunder.jit function")
        return 1
    for index, fn in enumerate(compiled):
        print(f"\n== thunder.jit function {index}: {getattr(fn, '__name__', type(fn).__name__)} ==")
        print(format_rows(explain(fn)))
    return 0


def _was_compiled(fn) -> bool:
    import thunder

    try:
        return bool(thunder.last_traces(fn))
    except Exception:  # noqa: BLE001 - never called: nothing to explain
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="thunderplug", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    plugins = commands.add_parser("plugins", help="list installed plugins, their status and executors")
    plugins.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    plugins.set_defaults(run=_plugins)

    demo = commands.add_parser("demo", help="compile and train a small model with discover() and show what each plugin did")
    demo.add_argument("--steps", type=int, default=5, help="training steps (default: 5)")
    demo.add_argument("--plot", metavar="PNG", help="write the eager and compiled loss curves to this PNG (needs matplotlib)")
    demo.set_defaults(run=_demo)

    explain = commands.add_parser("explain", help="run a script and show which executor took each op, and why others declined")
    explain.add_argument("script")
    explain.add_argument("script_args", nargs=argparse.REMAINDER)
    explain.set_defaults(run=_explain)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
