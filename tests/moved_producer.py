"""A producer on this machine whose journal is copied file by file while it
writes, for the cluster workflow's torn copies: an offline evaluation that
logs 100 episodes and moves them into its data file, says ``moved`` and
waits on stdin (the parent copies ``data.mdb`` then); logs 550 more (past a
spool segment's size, so that one is filled, moved and deleted) and moves
them, logs 50 more left spooled, says ``spooled``, waits on stdin, and kills
itself (the parent copies the spool segments left, as rsync copies
``spool-*`` after ``data.mdb``).

Usage: python moved_producer.py RUNS_DIR BASE_URL
"""

from __future__ import annotations

import os
import signal
import sys

import workloads

import primeruns as pr
from primeruns.journal import spool

EPISODES = 700


def main() -> None:
    # The 550 episodes fill a segment and go past it: a full segment goes on
    # while its first sync runs (up to twice SEGMENT_MAX), so on a loaded host
    # they could all stay in one segment, none moved and deleted. An eighth
    # past full, as the spool's own tests set it, makes the switch certain.
    spool._GO_ON_SHARE = 8
    runs_dir, base_url = sys.argv[1:3]
    run = pr.init(
        environments=["gsm8k"], model="m", mode="offline", runs_dir=runs_dir, base_url=base_url
    )
    journal = run._recorder.journal  # moved by hand: the background's moves are timed
    episodes = workloads.gsm8k(EPISODES)
    print(f"journal {run.journal_path}", flush=True)
    for episode in episodes[:100]:
        run.log_episodes([episode])
    journal.compact(())  # compacts nothing: moves what is spooled into LMDB
    print("moved", flush=True)
    sys.stdin.readline()
    for episode in episodes[100:650]:
        run.log_episodes([episode])
    journal.compact(())
    for episode in episodes[650:]:
        run.log_episodes([episode])
    print("spooled", flush=True)
    sys.stdin.readline()
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
