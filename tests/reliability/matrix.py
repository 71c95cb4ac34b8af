"""The configuration matrix and its oracle.

Each trial runs ``matrix_producer.py`` in its own process against a local
platform, in one configuration users have:

- threads {1, 8} logging into the run,
- Prime Traces {enabled, not enabled for the account, opted out},
- pyarrow {present, absent},
- kind {eval, train},
- faults {none, retryable, ambiguous (committed, answer lost), 500, the
  platform down from before ``init()`` until the producer has logged all},
- endings {finish, exception, SIGTERM, SIGKILL of the whole job + ``primeruns
  replay``, SIGKILL of the producer alone (its uplink ships and closes the
  run, no command run), SIGKILL + a requeued job with the same run id
  (training)},
- shipping {in the uplink process, in threads of the producer (the fallback
  where a process cannot be started; no uplink outlives a SIGKILL there, so
  the SIGKILL of the producer alone is not one of its endings)}.

The oracle, checked on the platform's own database:

- every record whose ``log_*`` call returned lands exactly once in every sink
  that applies (Prime Traces unless it is off; the eval sample table; the
  training metrics; the Parquet sample table on its cadence when pyarrow is
  there), and nothing else lands;
- the run's final status is the one the ending caused;
- the platform holds exactly one run for the trial's one ``init()``.

``test_rel_matrix.py`` runs a bounded, covering sample in CI; ``-m slow``
runs every configuration.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import procs
import rel_helpers as rh
from sdk_helpers import wait_for

from primeruns.journal.lock import lock_held
from primeruns.local import LocalPlatform

PRODUCER = Path(__file__).resolve().parent / "matrix_producer.py"
KEY = "test-key-0123456789"
THREADS = (1, 8)
TRACES = ("enabled", "not_enabled", "opted_out")
PYARROW = ("present", "absent")
KINDS = ("eval", "train")
FAULTS = ("none", "retryable", "ambiguous", "500", "down")
SHIPPING = ("uplink", "threads")
ENDINGS = (
    "finish",
    "exception",
    "sigterm",
    "sigkill_replay",
    "sigkill_producer",
    "sigkill_requeue",
)
# First on PYTHONPATH, it hides pyarrow from a process and its uplink.
_NO_PYARROW = str(Path(__file__).resolve().parents[1] / "data" / "without_pyarrow")
# How long the uplink of a producer killed alone may take to close its run.
_UPLINK_CLOSE_S = 90.0
SAMPLE_CADENCE = 10  # every 10th training step feeds the Parquet sample table


@dataclass(frozen=True)
class Config:
    threads: int
    traces: str
    pyarrow: str
    kind: str
    faults: str
    ending: str
    shipping: str = "uplink"

    @property
    def label(self) -> str:
        return (
            f"{self.kind}-t{self.threads}-traces_{self.traces}-pyarrow_{self.pyarrow}-"
            f"{self.faults}-{self.ending}-{self.shipping}"
        )


def all_configs() -> list[Config]:
    """Every configuration that exists (a requeue is a training run's ending)."""
    out = []
    for threads, traces, pyarrow, kind, faults, ending, shipping in itertools.product(
        THREADS, TRACES, PYARROW, KINDS, FAULTS, ENDINGS, SHIPPING
    ):
        if ending == "sigkill_requeue" and kind != "train":
            continue
        if ending == "sigkill_producer" and shipping == "threads":
            continue  # no uplink to outlive the producer
        out.append(Config(threads, traces, pyarrow, kind, faults, ending, shipping))
    return out


def covering_sample(size: int, seed: int = 0) -> list[Config]:
    """``size`` configurations in which every value of every dimension occurs
    (cycled through in a seeded shuffle), for the bounded CI run."""
    rng = random.Random(seed)
    dims = [
        list(THREADS),
        list(TRACES),
        list(PYARROW),
        list(KINDS),
        list(FAULTS),
        list(ENDINGS),
        list(SHIPPING),
    ]
    for values in dims:
        rng.shuffle(values)
    chosen: list[Config] = []
    i = 0
    while len(chosen) < size:
        threads, traces, pyarrow, kind, faults, ending = (d[i % len(d)] for d in dims[:-1])
        # Every other pair: cycled with the other two-valued dimensions it
        # would always meet the same thread count and kind.
        shipping = dims[-1][(i // 2) % len(dims[-1])]
        if ending == "sigkill_requeue":
            kind = "train"
        if ending == "sigkill_producer":
            shipping = "uplink"  # the ending needs an uplink to outlive the producer
        chosen.append(Config(threads, traces, pyarrow, kind, faults, ending, shipping))
        i += 1
    return chosen


@dataclass
class Outcome:
    config: Config
    problems: list[str] = field(default_factory=list)
    records: int = 0
    ghosts: int = 0  # empty extra training runs a lost create answer left

    @property
    def ok(self) -> bool:
        return not self.problems


class Platforms:
    """One local platform per Prime Traces setting, shared by a module's trials."""

    def __init__(self, root: Path) -> None:
        self.enabled = LocalPlatform(root / "traces-on").start()
        self.disabled = LocalPlatform(root / "traces-off", traces_disabled=True).start()

    def of(self, config: Config) -> LocalPlatform:
        return self.disabled if config.traces == "not_enabled" else self.enabled

    def stop(self) -> None:
        self.enabled.stop()
        self.disabled.stop()


def _faults(config: Config) -> dict[str, Any]:
    return {
        "none": {"retryable_rate": 0.0, "ambiguous_rate": 0.0},
        "retryable": {"retryable_rate": 0.25, "statuses": [429, 503, 502]},
        "ambiguous": {"ambiguous_rate": 0.25},
        "500": {"retryable_rate": 0.25, "statuses": [500]},
        "down": {"retryable_rate": 0.0, "ambiguous_rate": 0.0},
    }[config.faults]


def _create_train_run(lp: LocalPlatform, name: str) -> str:
    created = httpx.post(
        f"{lp.url}/api/v1/rft/external-runs",
        json={"base_model": "m", "max_steps": 30, "team_id": "team-a", "name": name},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    created.raise_for_status()
    return str(created.json()["run"]["id"])


def run_trial(config: Config, platforms: Platforms, work: Path, seed: int = 0) -> Outcome:
    """Run one configuration end to end and check the oracle."""
    out = Outcome(config)
    lp = platforms.of(config)
    name = f"m-{seed}-{config.label}"
    n = 24 if config.kind == "train" else 120
    env_extra = {"PRIME_TRACES_URL": lp.url}
    if config.traces == "opted_out":
        env_extra["PRIME_TRACES_OPT_OUT"] = "1"
    if config.shipping == "threads":
        env_extra["PRIME_RUNS_UPLINK"] = "threads"
    env = rh.isolated_env(work, env_extra)
    if config.pyarrow == "absent":
        # Hidden from the producer and its uplink alike (a machine without it).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_NO_PYARROW, env.get("PYTHONPATH")]))
    runs = work / "runs"
    attach = None
    if config.ending == "sigkill_requeue":
        attach = _create_train_run(lp, name)
    lp.set_faults(seed=seed, **_faults(config))
    if config.faults == "down":
        lp.stop()
    argv = [str(runs), lp.url, config.kind, str(config.threads), str(n), config.ending, name]
    if attach:
        argv.append(attach)
    try:
        lines, journal, code = _produce(config, lp, argv, env)
    finally:
        if config.faults == "down":
            lp.start()
        lp.set_faults(retryable_rate=0.0, ambiguous_rate=0.0, statuses=[429, 503, 502])
    if code == 3:
        refused = next((ln for ln in lines if ln.startswith("init-error")), "")
        if config.kind == "train" and config.traces == "opted_out" and config.pyarrow == "absent":
            return out  # refused by design: its samples would have nowhere to go
        out.problems.append(f"init refused: {refused}")
        return out
    episodes = [ln.split()[2] for ln in lines if ln.startswith("ok episode ")]
    steps = [int(ln.split()[2]) for ln in lines if ln.startswith("ok metrics ")]
    out.records = len(episodes) + len(steps)
    if journal is None:
        out.problems.append(f"no journal line; exit {code}; output {lines[-5:]}")
        return out
    if config.ending == "sigkill_replay":
        _replay(journal, env, out)
    elif config.ending == "sigkill_producer":
        _wait_closed(lp, name, out)
    elif config.ending == "sigterm":
        # SIGTERM gives the run a short grace only (a scheduler's SIGKILL
        # follows), after which the run is closed out with what landed and
        # the rest is kept for the replay the warning names: on a loaded
        # machine against a platform answering 500s, that can be all of it.
        # So once the uplink let the journal go, the replay a user runs.
        wait_for(lambda: not lock_held(journal), _UPLINK_CLOSE_S, "the uplink to let go")
        _replay(journal, env, out)
    elif config.ending == "sigkill_requeue":
        again = [str(runs), lp.url, config.kind, "1", "0", "finish", name, str(attach)]
        more, _, code2 = _produce(config, lp, again, env)
        if code2 != 0:
            out.problems.append(f"the requeued job exited {code2}: {more[-3:]}")
    _check(config, lp, name, episodes, steps, out)
    return out


def _produce(
    config: Config, lp: LocalPlatform, argv: list[str], env: dict[str, str]
) -> tuple[list[str], Path | None, int]:
    proc = procs.start(
        [sys.executable, str(PRODUCER), *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    lines: list[str] = []
    journal: Path | None = None
    for raw in proc.stdout:
        line = raw.strip()
        lines.append(line)
        if line.startswith("journal "):
            journal = Path(line.split(" ", 1)[1])
        elif line == "logged all":
            if config.faults == "down" and lp.returncode is not None:
                lp.start()  # back before the ending, as a flaky platform comes back
            proc.stdin.write("go\n")
            proc.stdin.flush()
        elif line == "ready":
            if argv[5] == "sigterm":
                proc.send_signal(signal.SIGTERM)
            elif argv[5] == "sigkill_producer":
                proc.send_signal(signal.SIGKILL)  # an out-of-memory kill: the uplink lives
            else:
                procs.kill_job(proc)  # the job dies, uplink and all
        elif line.startswith("init-error"):
            break
    proc.wait(timeout=180)
    return lines, journal, proc.returncode


def _wait_closed(lp: LocalPlatform, name: str, out: Outcome) -> None:
    """Wait, running no command, for the uplink to close the run out."""
    deadline = time.monotonic() + _UPLINK_CLOSE_S
    while time.monotonic() < deadline:
        used = [lp.run(r["id"]) for r in lp.runs() if r.get("name") == name]
        used = [r for r in used if _holds_data(r)]
        if used and all(r["status"] != "RUNNING" for r in used):
            return
        time.sleep(0.2)  # polling the platform from outside: what a user would see
    out.problems.append(f"the uplink did not close the run within {_UPLINK_CLOSE_S:.0f} s")


def _replay(journal: Path, env: dict[str, str], out: Outcome) -> None:
    env = {**env, "PRIME_API_KEY": KEY}
    # The replay runs where pyarrow is (a login node with the train extra).
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != _NO_PYARROW
    )
    done = subprocess.run(
        [sys.executable, "-m", "primeruns", "replay", str(journal)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        out.problems.append(f"replay exited {done.returncode}: {done.stdout[-400:]}")


def _check(
    config: Config,
    lp: LocalPlatform,
    name: str,
    episodes: list[str],
    steps: list[int],
    out: Outcome,
) -> None:
    mine = [lp.run(r["id"]) for r in lp.runs() if r.get("name") == name]
    used = [r for r in mine if _holds_data(r)]
    if len(used) != 1:
        out.problems.append(f"{len(used)} runs named {name} hold its data: {mine}")
        return
    ghosts = len(mine) - 1
    # The one registration the wire cannot make exactly once: an external
    # training run's create has no lookup, so a lost answer (a dropped response,
    # or a SIGKILL between the commit and the journal write) can leave an empty run.
    answer_lost = config.faults == "ambiguous" or config.ending == "sigkill_replay"
    if ghosts and not (config.kind == "train" and answer_lost):
        out.problems.append(f"{ghosts} empty extra run(s) named {name}")
    out.ghosts = ghosts
    stored = used[0]
    run_id = stored["id"]
    expected = {
        "finish": "COMPLETED",
        "exception": "FAILED",
        "sigterm": "CANCELLED" if config.kind == "eval" else "FAILED",
        "sigkill_replay": "FAILED",
        "sigkill_producer": "FAILED",
        "sigkill_requeue": "COMPLETED",
    }[config.ending]
    if stored["status"] != expected:
        out.problems.append(f"status {stored['status']}, expected {expected}")
    traces_on = config.traces == "enabled"
    landed = rh.platform_episode_ids(lp.data_dir, run_id)
    want = Counter(episodes) if traces_on else Counter()
    if landed != want:
        missing = len(set(want) - set(landed))
        extra = sum(landed.values()) - sum(want.values()) + missing
        out.problems.append(f"Prime Traces: {missing} missing, {extra} extra of {len(want)}")
    if config.kind == "eval":
        samples = stored["samples"]
        if not samples["rows"] == samples["distinct"] == len(episodes):
            out.problems.append(f"sample table {samples}, expected {len(episodes)} rows once")
    else:
        got = rh.platform_metric_steps(lp.data_dir, run_id)
        if got != Counter(steps):
            out.problems.append(f"metrics steps {sorted(got.items())} != logged {sorted(steps)}")
        objects = sorted(o["step"] for o in stored["parquet_objects"])
        cadence = sorted(s for s in set(steps) if s % SAMPLE_CADENCE == 0)
        # The replaying process has pyarrow (a replay ends sigkill_replay and
        # sigterm): it ships the table the producer could not.
        shipper_has_pyarrow = config.pyarrow == "present" or config.ending in (
            "sigkill_replay",
            "sigterm",
        )
        want_objects = cadence if shipper_has_pyarrow else []
        if objects != want_objects:
            out.problems.append(f"Parquet objects for steps {objects}, expected {want_objects}")


def _holds_data(stored: dict[str, Any]) -> bool:
    return bool(
        stored["traces"]["episodes"]
        or stored["samples"]["rows"]
        or stored["train_metrics"]["rows"]
        or stored["parquet_objects"]
    )
