"""Episodes whose traces repeat an id, shipped to the local platform over loopback.

Prime Traces refuses an upload whose lines repeat a trace (or episode) id
(400 ``duplicate_trace_id``), naming the id, not its line. The SDK halved the
batch until the two records sharing it went apart: about log2(N) + 1
requests for each repeat, and a batch with several repeats was refused again
and again (95 of 300 episodes shipped in a 20 s finish). Now the records
that repeat an id are set apart in one step, counted as failed with the
service's reason, and the rest go in one request.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import module_platform
import pytest
import workloads
from sdk_helpers import API_KEY, platform_episode_ids, platform_trace_ids, point_at

import primeruns as pr
from primeruns.platform.client import PlatformClient

_server, local_platform = module_platform.fixtures()

# Each of these episodes carries the trace id of an earlier one.
_REPEATS = {40: 3, 41: 3, 120: 119, 200: 150, 299: 0}


def test_episodes_repeating_a_trace_id_fail_alone_and_the_rest_ship_in_one_go(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")  # its requests are counted here
    answered: list[bool] = []  # per upload request: stored (True) or refused
    traces = PlatformClient.traces

    def counted(client: PlatformClient, method: str, path: str, **kwargs: Any) -> Any:
        if method != "POST" or path != "/traces":
            return traces(client, method, path, **kwargs)
        try:
            answer = traces(client, method, path, **kwargs)
        except Exception:
            answered.append(False)
            raise
        answered.append(True)
        return answer

    monkeypatch.setattr(PlatformClient, "traces", counted)
    episodes = workloads.gsm8k(300)
    for repeat, original in _REPEATS.items():
        episodes[repeat]["traces"][0]["id"] = episodes[original]["traces"][0]["id"]
    run = pr.init(environments=["gsm8k"], api_key=API_KEY, base_url=lp.url, runs_dir=runs)
    run.log_episodes(episodes)
    run.finish(timeout=120)
    assert run.id is not None

    # Every other episode is in Prime Traces once, and each trace id once.
    kept = [e for i, e in enumerate(episodes) if i not in _REPEATS]
    assert platform_episode_ids(lp.data_dir, run.id) == Counter(e["id"] for e in kept)
    assert platform_trace_ids(lp.data_dir, run.id) == Counter(
        t["id"] for e in kept for t in e["traces"]
    )
    # The sample table takes every episode: a trace id is nothing to it.
    assert lp.run(run.id)["samples"]["rows"] == 300
    # The repeats are counted, with the service's reason.
    assert run.failed_records == {"traces": len(_REPEATS)}
    assert any("duplicate_trace_id" in e or "repeats" in e for e in run.errors), run.errors
    # A refusal sets apart every repeat the batch holds: one request more
    # for the batch, not a halving per repeat.
    stored, refused = answered.count(True), answered.count(False)
    assert refused <= 2, answered
    assert len(answered) <= stored + len(_REPEATS) + 1, answered
