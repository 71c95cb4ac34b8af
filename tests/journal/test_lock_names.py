"""What a refused process is told about the owner of a journal: the lock
file names it, and the file is anyone's to write, so a name it gives is
shown only when it is a command's name."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from primeruns.exceptions import JournalLockedError
from primeruns.journal.lock import LOCK_NAME, OwnerLock, acting_as, read_owner


def test_a_command_holding_a_journal_is_named_to_the_process_it_refuses(tmp_path: Path) -> None:
    with acting_as("sync"):
        held = OwnerLock(tmp_path)
    try:
        with pytest.raises(JournalLockedError) as refused:
            OwnerLock(tmp_path)
        assert "is owned by `primeruns sync` (pid " in str(refused.value)
        # Taken outside a command, a lock names no command.
        other = tmp_path / "other"
        other.mkdir()
        plain = OwnerLock(other)
        owner = read_owner(other)
        assert owner is not None and owner.command is None
        plain.release()
    finally:
        held.release()


@pytest.mark.parametrize("given", ["sync\x1b[2J", "a" * 40, "sync now", 7, ["sync"]])
def test_a_lock_file_naming_anything_but_a_command_names_none(
    tmp_path: Path, given: object
) -> None:
    (tmp_path / LOCK_NAME).write_text(
        json.dumps({"pid": 1, "host": "h", "started": 0.0, "command": given})
    )
    owner = read_owner(tmp_path)
    assert owner is not None and owner.command is None
    assert owner.describe() == "pid 1 on h"


@pytest.mark.parametrize(
    "body",
    [
        '{"pid": Infinity, "host": "h", "started": 0}',
        '{"pid": 1e400, "host": "h", "started": 0}',
        '{"pid": 1, "host": "h", "started": 0, "proc_start": NaN}',
        '{"pid": 1, "host": "h", "started": 0, "helper_pid": -Infinity}',
        '{"pid": 99999999999999999999999, "host": "h", "started": 0, "helper_pid": 5}',
        '{"pid": 1, "host": "h", "started": 0, "helper_pid": 99999999999999999999999}',
        '{"pid": -1, "host": "h", "started": 0}',
        "[" * 70_000,
    ],
    ids=["inf", "1e400", "nan-start", "inf-helper", "huge", "huge-helper", "negative", "deep"],
)
def test_a_lock_file_no_process_could_have_written_names_no_owner(
    tmp_path: Path, body: str
) -> None:
    """Found by an adversarial review: a lock file naming a pid json reads
    as an infinity, nested past what json reads, or a pid past what the
    kernel takes raised OverflowError or RecursionError out of its read or
    its description; a requeued job's close-out reads the lock file of its
    predecessor's sync journal (who ships it), and the run was never closed."""
    (tmp_path / LOCK_NAME).write_text(body)
    owner = read_owner(tmp_path)
    assert owner is None or owner.describe().startswith("pid ")


def test_a_lock_files_host_is_described_without_its_control_characters(tmp_path: Path) -> None:
    """Found by an adversarial review: a requeued job's finish() names who
    ships its predecessor's copy from the sync journal's lock file, in a
    warning the SDK logs to the user's terminal (no CLI makes it inert):
    the host the file gave reached it raw, escapes and all."""
    (tmp_path / LOCK_NAME).write_text(
        json.dumps({"pid": 1, "host": "node\x1b]0;owned\x07\x9b2J", "started": 0.0})
    )
    owner = read_owner(tmp_path)
    assert owner is not None
    assert owner.describe() == "pid 1 on node\\x1b]0;owned\\x07\\x9b2J"


def test_a_command_run_in_one_thread_names_no_lock_another_thread_takes(
    tmp_path: Path,
) -> None:
    """Found by an adversarial review: ``cli.main`` called in a thread of a
    user's process (a notebook running ``sync`` beside its training) named
    every lock the process took meanwhile, its run's own among them, as
    that command's: a refused ``replay`` was told the run was a sync."""
    inside, done = threading.Event(), threading.Event()

    def command() -> None:
        with acting_as("sync"):
            inside.set()
            done.wait()

    thread = threading.Thread(target=command)
    thread.start()
    try:
        assert inside.wait(60)
        held = OwnerLock(tmp_path)
    finally:
        done.set()
        thread.join()
    try:
        owner = read_owner(tmp_path)
        assert owner is not None and owner.command is None, owner
    finally:
        held.release()
