"""The victim of the hostile-neighbour tests (#27), run as a real uid (root or
an unprivileged one, see ``tests/second_uid.py``): it runs ``primeruns``
commands in turn over a runs directory another user planted things in, and
after each one checks that a file of its own is still byte for byte what it
was.

Usage: ``trust_victim.py PLAN`` where PLAN is a JSON object:

- ``"own"`` (optional): a folder to move a finished offline run of the
  victim's own into (made in ``$HOME``'s runs directory first, as ``cp``
  from a node would bring it);
- ``"init_in"`` (optional): a runs directory to start an offline run in
  (``init`` must refuse one another user could write into);
- ``"watched"`` (optional): the victim's file that must stay intact;
- ``"commands"``: a list of ``primeruns`` argument lists.

Prints one JSON object: ``{"own": local id or null, "init": null or why
init refused, "steps": [{"argv",
"code", "out", "err", "intact"}]}``; an exception in a command is a step
with code ``"raised"`` and its traceback as ``err``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any


def _own_run(into: Path) -> str:
    import primeruns as pr

    runs = Path(os.environ["HOME"]) / "runs"
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    run.finish()
    (journal,) = [p for p in runs.iterdir() if not p.name.startswith(".")]  # not .summaries
    os.rename(journal, into / journal.name)
    return journal.name


def _init_in(runs: Path) -> str | None:
    import primeruns as pr

    try:
        run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    run.finish()
    return None


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode(errors="replace")


def main() -> int:
    plan: dict[str, Any] = json.loads(sys.argv[1])
    from primeruns.cli import main as primeruns

    own = _own_run(Path(plan["own"])) if plan.get("own") else None
    refused = _init_in(Path(plan["init_in"])) if plan.get("init_in") else None
    watched = Path(plan["watched"]) if plan.get("watched") else None
    before = watched.read_bytes() if watched else b""
    steps = []
    for argv in plan["commands"]:
        # Binary underneath, as a real stdout: export writes to its buffer.
        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="replace")
        err = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: int | str = primeruns(argv)
            except BaseException:  # reported, not hidden: the test names it
                code = "raised"
                traceback.print_exc()
        steps.append(
            {
                "argv": argv,
                "code": code,
                "out": _text(out),
                "err": err.getvalue(),
                "intact": watched is None or watched.read_bytes() == before,
            }
        )
    print(json.dumps({"own": own, "init": refused, "steps": steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
