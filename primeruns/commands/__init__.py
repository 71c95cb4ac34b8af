"""The ``primeruns`` sub-commands that read, ship and tidy journals (issue #6).

One small module per command, each exposing ``add_parser(sub)`` that registers
the command and its handler; :mod:`primeruns.cli` only wires them together.
Shared pieces (run lookup, the rich console and its colours, the progress
bars, sparklines) live in their own modules so every command speaks the same
way.
"""

from __future__ import annotations

__all__ = ["COMMANDS"]

# Registration order is the order ``primeruns --help`` lists them in.
COMMANDS = ("ls", "show", "replay", "export", "gc", "doctor", "demo")
