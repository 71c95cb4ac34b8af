"""Write the checked-in sample journal under tests/journal/data/ (format stability).

Run ``python tools/make_sample_journal.py`` only when adding a *new* sample for
a new format version: the existing sample must keep reading with every later
version (tests/journal/test_sample.py), so that a format change can never
orphan a user's unshipped runs.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from primeruns.journal import FORMAT_VERSION, EntryKind, InFlight, Journal

OUT = Path(__file__).resolve().parents[1] / "tests" / "journal" / "data"
LOCAL_ID = f"sample-v{FORMAT_VERSION}"


def records(version: int = FORMAT_VERSION) -> list[tuple[EntryKind, bytes]]:
    """The sample's entries for a format version, in order (the test compares)."""
    out = [(EntryKind.RUN_OPEN, json.dumps({"kind": "eval", "model": "m"}).encode())]
    if version >= 2:  # entries stored in chunks: compressed sizes from ~1.5 to ~10 KB
        for i, size in enumerate((1_500, 4_000, 20_000)):
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
    if version >= 3:  # left in the staging table, as a crash leaves them (see main)
        for i in range(3):
            row = {"id": f"staged-{i}", "text": f"staged episode {i} " * 200}
            out.append((EntryKind.EPISODE, json.dumps(row).encode()))
    return out


STAGED = 3  # the last entries of a version-3 sample stay staged


def main() -> None:
    target = OUT / LOCAL_ID
    shutil.rmtree(target, ignore_errors=True)
    all_records = records()
    staged = STAGED if FORMAT_VERSION >= 3 else 0
    with Journal.create(OUT, local_id=LOCAL_ID, meta={"spec": {"kind": "eval"}}) as j:
        for i, (kind, payload) in enumerate(all_records[: len(all_records) - staged]):
            if i == len(all_records) - staged - 13:
                # Entries after this point use the trained dictionary: the sample
                # then pins the dictionary format too.
                j.train_dictionaries()  # (the mover's thread may have been first)
                assert EntryKind.METRICS in j._dicts.active
            j.append(kind, [payload])
        j.set_inflight("traces", InFlight(1, 3, b"exact body", {"idempotency_key": "k"}))
        j.ack("eval_samples", 10, failed=1, reason="422 sample rejected")
        if staged:
            # Stop the background compression, stage the last entries and take
            # the files as a crashed process leaves them (close would move them).
            while j._mover.move_some():
                pass
            j._mover.stop()
            for kind, payload in all_records[-staged:]:
                j.append(kind, [payload])
            assert j._mover.staged == staged
            j.sync()
            crashed = OUT / f"{LOCAL_ID}.tmp"
            shutil.rmtree(crashed, ignore_errors=True)
            shutil.copytree(target, crashed)
        j.sync()
    if staged:
        shutil.rmtree(target)
        crashed.rename(target)
    (target / "lock.mdb").unlink(missing_ok=True)  # runtime state, not part of the format
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
