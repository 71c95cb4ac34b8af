"""A sync for the power-cut tests: imports a copy into its sync journal on
the mount, prints ``imported``, then waits (never closing the journal,
whose close would sync it) for the test to cut the power.

Usage: python powercut_import.py COPY SYNC_ROOT
The background sync is kept from running: the cut comes within the second
it waits, where what the import wrote is synced by nothing else.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from primeruns.journal import Journal, maintenance
from primeruns.ship.mirror import import_new, open_sync_journal


def main() -> None:
    maintenance.SYNC_INTERVAL = 3600.0
    with Journal.open(Path(sys.argv[1]), owner=False) as source:
        sync, _ = open_sync_journal(source, Path(sys.argv[2]))
        done = import_new(source, sync, final=True)
        print(f"imported {done.upto} {sync.path}", flush=True)
        while True:
            time.sleep(60)


if __name__ == "__main__":
    main()
