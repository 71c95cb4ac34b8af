"""Print the shell commands of the README's Quick start, one per line.

``.ci/run`` runs exactly these in a fresh clone, so the README cannot promise a
command that CI does not prove. Exits 1 unless the Quick start's literal block
holds exactly two commands.
"""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.rst"


def quickstart_commands(text: str) -> list[str]:
    """The indented lines of the first literal block (``::``) under "Quick start"."""
    lines = text.splitlines()
    start = lines.index("Quick start")
    block = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith("::"))
    commands: list[str] = []
    for line in lines[block + 1 :]:
        if line.strip() and not line.startswith((" ", "\t")):
            break
        if line.strip():
            commands.append(line.strip())
    return commands


def main() -> int:
    commands = quickstart_commands(README.read_text(encoding="utf-8"))
    if len(commands) != 2:
        print(f"README Quick start: expected 2 commands, found {len(commands)}", file=sys.stderr)
        return 1
    print("\n".join(commands))
    return 0


if __name__ == "__main__":
    sys.exit(main())
