"""Regenerate the golden projection fixtures under ``tests/data/`` from the vendor.

The tests in ``tests/test_projection.py`` and ``tests/test_metrics.py`` hold this
SDK's projection of episode *mappings* to what the vendor's ``prime-runs`` 0.1.4
computes from verifiers *objects*. This dev script produces that expected output;
the tests only read the checked-in fixtures and never need the vendor.

Set up (throwaway targets, never site-packages: both would clobber the
``prime_runs`` import name of this project)::

    pip install --no-deps --target /tmp/vfpkg verifiers==0.4.0 \\
        prime-pydantic-config renderers openai httpx2 anthropic opentelemetry-api \\
        jiter docstring-parser prime-sandboxes tenacity "connectrpc<0.12" \\
        "protobuf-py==0.1.1" protobuf pyqwest aiofiles
    pip install --no-deps --target /tmp/vrpkg prime-runs==0.1.4
    PYTHONPATH=/tmp/vfpkg:/tmp/vrpkg python tools/make_golden_projection.py

(pydantic and numpy come from the system Python.) verifiers' package
``__init__`` pulls in every runtime and client; the script skips it by
registering bare package modules, so that only the record models load.

Each fixture holds the inputs as ``Episode.to_record()`` mappings (what this SDK
journals) and the vendor's output on the same episodes as objects:

- ``golden_eval.json.zst``: 20 gsm8k episodes plus hand-made variants (null and
  empty rewards, errors, truncation, branches, usage counters, judges, an
  episode without traces, NaN metrics...): v0 rows built in two calls sharing one
  rollout counter, and ``metrics.from_episodes``;
- ``golden_train.json.zst``: 6 agentic training episodes: v0 rows, the Parquet
  rows read back (without ``created_at``), and ``from_episodes``;
- ``golden_oversize.json.zst``: the per-trace fallback, with the vendor's sample
  ceiling lowered to ``limit`` bytes.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import io
import json
import sys
import types
from pathlib import Path
from typing import Any

import zstandard

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / ".." / "shared" / "data"
DEFAULT_OUT = REPO / "tests" / "data"

TRAIN_RUN_ID = "run-golden"
TRAIN_STEP = 20
TRAIN_OFFSET = 3 * 2**32


def _load_vendor() -> tuple[Any, Any, Any]:
    spec = importlib.util.find_spec("verifiers")
    if spec is None or spec.origin is None:
        sys.exit("verifiers is not importable: see this script's docstring for PYTHONPATH")
    root = Path(spec.origin).parent
    for name, path in (("verifiers", root), ("verifiers.v1", root / "v1")):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    sys.modules["verifiers"].__version__ = "0.4.0"  # type: ignore[attr-defined]
    import prime_runs.metrics as vendor_metrics
    import prime_runs.projection as vendor_projection
    from verifiers.v1.episode import WireEpisode

    if Path(vendor_projection.__file__).resolve().is_relative_to(REPO):
        sys.exit("prime_runs resolves to this repository, not the vendor: fix PYTHONPATH")
    return WireEpisode, vendor_projection, vendor_metrics


def _read_jsonl(path: Path, count: int) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    with path.open("rb") as raw:
        reader = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(raw), "utf-8")
        for line in reader:
            records.append(json.loads(line))
            if len(records) >= count:
                break
    return records


def _variants(base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hand-made episodes covering the projection's corner cases, derived from
    real gsm8k records so that they stay valid verifiers episodes."""
    out: list[dict[str, Any]] = []

    def variant(index: int, name: str) -> dict[str, Any]:
        record = copy.deepcopy(base[index])
        record["id"] = f"variant-{name}"
        for number, trace in enumerate(record["traces"]):
            trace["id"] = f"variant-{name}-trace-{number}"
        out.append(record)
        return record

    rec = variant(0, "null-rewards")
    trace = rec["traces"][0]
    trace["rewards"] = {"correct_answer": None, "format_reward": {"score": 0.5, "weight": 2.0}}
    trace["metrics"] = {**trace["metrics"], "num_turns": None}

    rec = variant(1, "no-rewards")
    rec["traces"][0]["rewards"] = {}
    rec["traces"][0]["metrics"] = {}

    rec = variant(2, "error")
    rec["ok"] = False
    trace = rec["traces"][0]
    trace["ok"] = False
    trace["stop_condition"] = "error"
    trace["errors"] = [
        {"type": "ValueError", "message": "first", "traceback": "tb"},
        {"type": "ProviderError", "message": "upstream 500", "status_code": 500},
    ]

    rec = variant(3, "truncated-by-length")
    trace = rec["traces"][0]
    trace["stop_condition"] = None
    trace["calls"][-1]["finish_reason"] = "length"

    rec = variant(4, "branches")
    trace = rec["traces"][0]
    # A second leaf forking after the first message: two branches.
    fork = copy.deepcopy(trace["nodes"][-1])
    fork["parent"] = 0
    trace["nodes"].append(fork)
    fork_call = copy.deepcopy(trace["calls"][-1])
    fork_call["node"] = len(trace["nodes"]) - 1
    fork_call["usage"] = {"prompt_tokens": 7, "completion_tokens": 3, "cached_input_tokens": 5}
    trace["calls"].append(fork_call)

    rec = variant(5, "usage-counters")
    trace = rec["traces"][0]
    extra = copy.deepcopy(trace["calls"][-1])
    extra["node"] = None
    extra["usage"] = {
        "prompt_tokens": 11,
        "completion_tokens": 13,
        "cached_input_tokens": 17,
        "reasoning_tokens": 4,
        "cost": 0.0125,
    }
    trace["calls"][-1]["usage"]["cost"] = 0.5
    trace["calls"].append(extra)

    rec = variant(6, "judge-first")
    solver = rec["traces"][0]
    judge = copy.deepcopy(solver)
    judge["id"] = "variant-judge-first-judge"
    judge["agent"]["name"] = "judge"
    judge["agent"]["trainable"] = False
    judge["rewards"] = {"judge_score": {"score": 0.25, "weight": 1.0}}
    judge["metrics"] = {"judge_latency": 1.5}
    judge["task"]["data"]["idx"] = 999
    judge["info"] = {"advantage": -1.0}
    rec["traces"] = [judge, solver]

    rec = variant(7, "all-untrainable")
    for trace in rec["traces"]:
        trace["agent"]["trainable"] = False
    second = copy.deepcopy(rec["traces"][0])
    second["id"] = "variant-all-untrainable-second"
    second["rewards"] = {"correct_answer": {"score": 1.0, "weight": 1.0}, "agent": {"score": 3.0}}
    second["metrics"] = {"correct_answer": 0.0, "tool_calls": 2.0}
    rec["traces"].append(second)

    rec = variant(8, "no-traces")
    rec["traces"] = []

    rec = variant(9, "no-nodes-no-calls")
    trace = rec["traces"][0]
    trace["nodes"] = []
    trace["calls"] = []
    trace["tools"] = [
        {"type": "function", "name": "calc", "description": "adds", "parameters": {"a": None}}
    ]
    trace["info"] = {}

    rec = variant(10, "nan-metric")
    metrics = rec["traces"][0]["metrics"]
    rec["traces"][0]["metrics"] = {
        **metrics,
        "nan_metric": float("nan"),
        "inf_metric": float("inf"),
    }
    return out


def _write(path: Path, payload: dict[str, Any]) -> None:
    # Python's json keeps NaN (the NaN variant needs it). Key order is kept: it is
    # part of the JSON text columns under test.
    text = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    params = zstandard.ZstdCompressionParameters.from_level(19, enable_ldm=True, window_log=27)
    path.write_bytes(zstandard.ZstdCompressor(compression_params=params).compress(text))
    print(f"{path.name}: {len(text)} bytes of JSON, {path.stat().st_size} on disk")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    episode_cls, vendor_projection, vendor_metrics = _load_vendor()
    args.out.mkdir(parents=True, exist_ok=True)

    gsm8k = _read_jsonl(args.data / "gsm8k-eval.jsonl.zst", 40)
    eval_objects = [episode_cls.model_validate(r) for r in gsm8k[:20] + _variants(gsm8k[20:])]
    first_call = 12
    counts: dict[Any, int] = {}
    samples = vendor_projection.build_samples(eval_objects[:first_call], counts)
    samples += vendor_projection.build_samples(eval_objects[first_call:], counts)
    _write(
        args.out / "golden_eval.json.zst",
        {
            "inputs": [episode.to_record() for episode in eval_objects],
            "first_call": first_call,
            "samples": samples,
            "rollout_numbers": [[key, value] for key, value in counts.items()],
            "summary": vendor_metrics.from_episodes(eval_objects),
        },
    )

    agentic = _read_jsonl(args.data / "agentic-train.jsonl.zst", 60)
    smallest = sorted(agentic, key=lambda record: len(json.dumps(record)))[:6]
    train_objects = [episode_cls.model_validate(record) for record in smallest]
    import pyarrow.parquet as pq

    payload = vendor_projection.episodes_to_parquet_bytes(
        train_objects, TRAIN_RUN_ID, TRAIN_STEP, sample_id_offset=TRAIN_OFFSET
    )
    rows = pq.read_table(io.BytesIO(payload)).to_pylist()
    for row in rows:
        del row["created_at"]  # the vendor's "now"
    _write(
        args.out / "golden_train.json.zst",
        {
            "inputs": [episode.to_record() for episode in train_objects],
            "run_id": TRAIN_RUN_ID,
            "step": TRAIN_STEP,
            "sample_id_offset": TRAIN_OFFSET,
            "rows": rows,
            "samples": vendor_projection.build_samples(train_objects),
            "summary": vendor_metrics.from_episodes(train_objects),
        },
    )

    # A multi-trace episode and a small one, under a ceiling between their row sizes.
    oversize = [eval_objects[20 + 6], eval_objects[0]]
    big, small = (
        vendor_projection.json_bytes(vendor_projection.build_samples([episode])[0])
        for episode in oversize
    )
    assert small < big, (small, big)
    limit = (small + big) // 2 + vendor_projection.ENVELOPE_BYTES
    vendor_projection.MAX_SAMPLES_PAYLOAD_BYTES = limit
    _write(
        args.out / "golden_oversize.json.zst",
        {
            "inputs": [episode.to_record() for episode in oversize],
            "limit": limit,
            "samples": vendor_projection.build_samples(oversize),
        },
    )


if __name__ == "__main__":
    main()
