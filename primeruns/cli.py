"""The ``primeruns`` command line: one entry point, one sub-command a job.

Each sub-command lives in the module that owns its work (the local platform's
``serve`` in :mod:`primeruns.local`); this module only parses and dispatches,
so ``primeruns --help`` is the one place that lists them all.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .local.cli import add_serve_arguments, run_serve

    parser = sub.add_parser(
        "serve",
        help="serve the local platform (the platform's HTTP API on SQLite, with fault injection)",
        description=run_serve.__doc__,
    )
    add_serve_arguments(parser)
    parser.set_defaults(handler=run_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="primeruns",
        description="Track, inspect, recover and ship prime-runs journals.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
