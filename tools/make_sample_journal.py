"""Write the checked-in sample journal under tests/journal/data/ (format stability).

Run ``python tools/make_sample_journal.py`` only when adding a *new* sample for
a new format version: the existing sample must keep reading with every later
version (tests/journal/test_sample.py), so that a format change can never
orphan a user's unshipped runs.

The sample is what a run leaves on disk in the current format: entries of
several kinds, some stored in chunks and some compressed with a trained zstd
dictionary; a sink's in-flight batch with its exact body and another's
acknowledged cursor with a loss; the run's spec in meta; and its last entries
still in the spool, as a process killed before its mover absorbed them
leaves them.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from primeruns.journal import FORMAT_VERSION, EntryKind, InFlight, Journal
from primeruns.journal.frames import peek_header
from primeruns.journal.layout import CHUNK_KEY
from primeruns.journal.spool import list_segments
from primeruns.journal.txn import RESERVE_NAME

OUT = Path(__file__).resolve().parents[1] / "tests" / "journal" / "data"
LOCAL_ID = f"sample-v{FORMAT_VERSION}"
SPOOLED = 3  # the sample's last entries stay in the spool (see main)


def records() -> list[tuple[EntryKind, bytes]]:
    """The sample's entries, in order (the test compares what it reads)."""
    out = [(EntryKind.RUN_OPEN, json.dumps({"kind": "eval", "model": "m"}).encode())]
    for i, size in enumerate((1_500, 4_000, 20_000)):
        # Compressed sizes from ~1.5 to ~10 KB: stored in chunks (see layout).
        noise = random.Random(i).randbytes(size).hex()
        out.append((EntryKind.EPISODE, json.dumps({"id": i, "noise": noise}).encode()))
    for i in range(20):
        ep = {"example_id": i, "reward": i / 20, "completion": "answer " * (i * 10)}
        out.append((EntryKind.EPISODE, json.dumps(ep).encode()))
        out.append((EntryKind.METRICS, json.dumps({"step": i, "loss": 1 / (i + 1)}).encode()))
    for i in range(150):  # enough similar rows to train (and pin) a zstd dictionary
        row = {
            "step": i,
            "train/loss": 1 / (i + 1),
            "train/reward_mean": i % 7 / 7,
            "train/kl_divergence": i / 1000,
            "train/entropy": 2 - i / 100,
            "train/learning_rate": 3e-6,
            "train/grad_norm": (i * 13 % 17) / 3,
            "train/tokens_per_second": 1000 + i,
            "eval/accuracy": i % 11 / 11,
        }
        out.append((EntryKind.METRICS, json.dumps(row).encode()))
    out.append((EntryKind.TRACE, b'{"trace":"t"}'))
    out.append((EntryKind.SUMMARY, b'{"accuracy":0.5}'))
    out.append((EntryKind.FINISH, b'{"status":"completed"}'))
    for i in range(SPOOLED):
        row = {"id": f"spooled-{i}", "text": f"spooled episode {i} " * 200}
        out.append((EntryKind.EPISODE, json.dumps(row).encode()))
    return out


def main() -> None:
    target = OUT / LOCAL_ID
    killed = OUT / f"{LOCAL_ID}.tmp"
    for old in (target, killed):
        shutil.rmtree(old, ignore_errors=True)
    stored, spooled = records()[:-SPOOLED], records()[-SPOOLED:]
    with Journal.create(OUT, local_id=LOCAL_ID, meta={"spec": {"kind": "eval"}}) as j:
        for i, (kind, payload) in enumerate(stored):
            if i == len(stored) - 13:
                # Entries after this point are compressed with the trained
                # dictionary: the sample then pins the dictionary format too.
                j.train_dictionaries()  # (the mover's thread may have been first)
                assert EntryKind.METRICS in j._dicts.active
            j.append(kind, [payload])
        j.set_inflight("traces", InFlight(1, 3, b"exact body", {"idempotency_key": "k"}))
        j.ack("eval_samples", 10, failed=1, reason="422 sample rejected")
        # Everything so far into LMDB, then the mover held: the last entries
        # stay spooled, and the files are taken as a killed process leaves
        # them (close would move them).
        j._mover.stop()
        j._absorb()
        with j._tx.read() as txn:
            stored_keys = list(txn.cursor(db=j._tx.dbs["entries"]))
        assert any(len(k) == CHUNK_KEY.size for k, _ in stored_keys)
        assert any(peek_header(v).dict_id for k, v in stored_keys if len(k) == 8)
        for kind, payload in spooled:
            j.append(kind, [payload])
        j.sync()
        assert list_segments(target)
        shutil.copytree(target, killed)
    shutil.rmtree(target)
    killed.rename(target)
    for runtime in ("lock.mdb", RESERVE_NAME):  # runtime state, not part of the format
        (target / runtime).unlink(missing_ok=True)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
