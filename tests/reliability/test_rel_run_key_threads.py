"""A run key's next process ships what a SIGKILLed process in threads mode left.

``PRIME_RUNS_UPLINK=threads`` is the fallback where no uplink process can
start: the uplink runs as threads of the producer, and a SIGKILL ends them
with it, its records still in its journal. With the uplink process, that
process outlives the kill and ships them; in threads mode the next process
of the run (the same ``run_key``) must, as it does for an ``id=`` attach:
the SDK is never worse in threads mode than with the process.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from rel_helpers import bound_run_id, isolated_env, platform_episode_ids
from rel_run_key import killed_leaving_all, producer

from primeruns.local import LocalPlatform


def test_a_run_keys_next_process_ships_what_a_killed_threads_mode_process_left(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    lp = own_platform
    runs = tmp_path / "runs"
    env = isolated_env(tmp_path, {"PRIME_RUNS_UPLINK": "threads", "PRIME_TRACES_URL": lp.url})
    # Registered; nothing of its records ships before its SIGKILL (299 of 310 left).
    journal, logged = killed_leaving_all(runs, lp, 300, env)
    run_id = bound_run_id(journal)
    assert run_id is not None
    assert not platform_episode_ids(lp.data_dir, run_id)  # all left in the dead journal

    nxt = subprocess.run(
        producer(runs, lp, 300, 10, "finish"),
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert nxt.returncode == 0, nxt.stderr[-2000:]
    logged += nxt.stdout.split("logged ", 1)[1].split("\n", 1)[0].split()
    stored = platform_episode_ids(lp.data_dir, run_id)
    assert len(logged) == 310
    assert stored == dict.fromkeys(logged, 1), (
        f"{len(set(logged) - set(stored))} not shipped; {nxt.stderr[-1500:]}"
    )
