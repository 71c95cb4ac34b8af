"""The ``primeruns`` command line: one entry point, one sub-command a job.

Each sub-command lives in the module that owns its work (the local platform's
``serve`` in :mod:`primeruns.local`, the journal commands in
:mod:`primeruns.commands`); this module only parses and dispatches, so
``primeruns --help`` is the one place that lists them all. Errors a user can
act on are one line on stderr with an honest exit code (see
:mod:`primeruns.commands.common`), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from .commands import COMMANDS
from .commands.common import EXIT_DAMAGED, EXIT_FAILED, EXIT_LOCKED, EXIT_USAGE, CommandError
from .exceptions import ConfigurationError, JournalCorruptError, JournalError, JournalLockedError
from .journal.lock import acting_as

Handler = Callable[[argparse.Namespace], int]

# The shells' codes for a process ended by SIGINT and by SIGPIPE.
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141
# What each optional dependency is for, and the extra that brings it.
_EXTRAS = {
    "uvicorn": "local",
    "starlette": "local",
    "multipart": "local",
    "python_multipart": "local",
    "pyarrow": "train",
}
_BAD_PATH = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
# Commands registered by another command's module.
_MODULE_OF = {"sync": "replay"}
# The modules of the commands that ship journals (``replay``, ``sync``).
_SHIPPING = frozenset({"replay"})


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .local.cli import add_serve_arguments, run_serve

    parser = sub.add_parser(
        "serve",
        help="serve the local platform (the platform's HTTP API on SQLite, with fault injection)",
        description=run_serve.__doc__,
    )
    add_serve_arguments(parser)
    parser.set_defaults(handler=run_serve)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the command ``only`` alone: each
    command's module imports what its work needs (``ls`` rich and the
    journal's listing, ``replay`` the uplink and httpx, ``serve`` the local
    platform), so a command loads only its own."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="primeruns",
        description="Track, inspect, recover and ship prime-runs journals. "
        "Start with `primeruns demo`; `primeruns COMMAND --help` explains each command.",
    )
    parser.add_argument("--version", action="version", version=f"primeruns {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if only in (None, name):
            importlib.import_module(f".commands.{name}", __package__).add_parser(sub)
    if only in (None, "serve"):
        _add_serve(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``primeruns`` command; ``argv`` None: this process's own arguments
    (it is the command's process: its script, ``python -m primeruns``)."""
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    # The command comes first (the top level's options take no value): a
    # named command's parser alone parses it as the whole one would.
    first = argv[0] if argv else ""
    module = _MODULE_OF.get(first, first)
    if program and module in _SHIPPING:
        # It ships and runs no user code, as the uplink process does: what
        # its libraries would load for nothing stays unloaded (``ship.lean``).
        # Not for a caller handing arguments (a test's process).
        from .ship import lean

        lean.mark_absent()
    parser = build_parser(module if module in (*COMMANDS, "serve") else None)
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        with acting_as(args.command):
            code = handler(args)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except KeyboardInterrupt:
        # A journal is changed only in transactions, and a batch in flight is
        # resent byte for byte: an interrupted command loses nothing.
        print(
            f"\nprimeruns {args.command}: interrupted; nothing is lost: run the same "
            "command again to go on",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``primeruns ls | head``): say nothing more,
        # and keep the interpreter from complaining when it flushes stdout.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_CLOSED_PIPE
    except ModuleNotFoundError as exc:
        extra = _EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"primeruns {args.command}: this needs {exc.name}, which is not installed: "
            f"pip install 'prime-runs[{extra}]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except CommandError as exc:
        print(f"primeruns {args.command}: error: {exc}", file=sys.stderr)
        return exc.code
    except JournalLockedError as exc:
        print(f"primeruns {args.command}: refused: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except JournalCorruptError as exc:
        print(f"primeruns {args.command}: damaged journal: {exc}", file=sys.stderr)
        return EXIT_DAMAGED
    except (JournalError, ConfigurationError) as exc:
        print(f"primeruns {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(f"primeruns {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, _BAD_PATH) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
