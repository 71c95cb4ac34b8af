"""The attacker of the hostile-neighbour tests (#27), run as ``nobody`` (see
``tests/second_uid.py``): it plants a journal-shaped folder in a shared runs
directory.

Usage: ``trust_plant.py FOLDER LINKED TARGET MODE``: ``FOLDER`` gets the
files of a real journal (made in ``$HOME``), except that ``LINKED``
(``lock.mdb``, ``owner.lock``, ``data.mdb``, or ``-`` for none) is a
symbolic link to ``TARGET``, the victim's file; the folder's mode is then
``MODE`` (octal: ``755`` one anybody may look into, ``700`` a private one).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from primeruns.journal import Journal


def main() -> int:
    folder, linked, target, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    honest = Journal.create(Path(os.environ["HOME"]) / "runs")
    honest.close()
    folder.mkdir()
    for name in ("data.mdb", "lock.mdb", "owner.lock"):
        if name == linked:
            os.symlink(target, folder / name)
        elif (honest.path / name).exists():
            (folder / name).write_bytes((honest.path / name).read_bytes())
    os.chmod(folder, int(mode, 8))
    return 0


if __name__ == "__main__":
    sys.exit(main())
