"""``python -m primeruns.local [serve options]``: the same as ``primeruns serve``."""

from __future__ import annotations

import argparse
import sys

from .cli import add_serve_arguments, run_serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m primeruns.local", description=run_serve.__doc__
    )
    add_serve_arguments(parser)
    return run_serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
