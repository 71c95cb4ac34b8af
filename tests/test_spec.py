"""The run's spec as a typed value (``primeruns.spec``): journals written by an
earlier release read back the same, the stored form never changes, and a
damaged or hostile spec fails with one exception naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sdk_helpers import point_at
from strategies import json_values

import primeruns as pr
from primeruns import records
from primeruns.journal import EntryKind, Journal
from primeruns.spec import (
    RunSpec,
    SpecEnvironment,
    SpecError,
    journal_spec,
    listed_spec,
    spec_or_default,
)

# Specs as init() stored them before RunSpec existed, keys in the order it
# wrote them: what a journal of the previous release holds.
STORED_EVAL: dict[str, Any] = {
    "kind": "eval",
    "name": "gsm8k-nightly",
    "environments": [{"name": "gsm8k"}, {"slug": "acme/math"}, {"id": "env-1", "version_id": "v2"}],
    "dataset": "gsm8k",
    "model": "Qwen/Qwen3-4B",
    "framework": "verifiers",
    "description": "nightly eval",
    "tags": ["nightly", "gsm8k"],
    "config": {"temperature": 0.7, "sampling": {"top_p": 0.9, "stop": ["</s>"]}},
    "team_id": "team-a",
    "training": None,
    "attach_id": None,
    "frontend_url": "https://app.primeintellect.ai",
    "base_url": "https://api.primeintellect.ai/api/v1",
    "traces_url": "https://api.primeintellect.ai",
    "traces_opt_out": False,
    "mode": "offline",
}
STORED_TRAIN: dict[str, Any] = {
    **STORED_EVAL,  # the same keys, in the same order
    "kind": "train",
    "name": None,
    "environments": [{"slug": "acme/math"}],
    "dataset": "math",
    "model": "m",
    "framework": None,
    "description": None,
    "tags": [],
    "config": {"lr": 0.0001},
    "training": {"max_steps": 100, "batch_size": 8, "wandb_project": "rl"},
}
# The init() calls that stored them (the URLs are the default platform's).
INIT_EVAL: dict[str, Any] = {
    **{k: STORED_EVAL[k] for k in ("name", "model", "framework", "description", "config")},
    "environments": ["gsm8k", "acme/math", {"id": "env-1", "version_id": "v2"}],
    "tags": ["nightly", "gsm8k"],
    "team_id": "team-a",
}
INIT_TRAIN: dict[str, Any] = {
    "kind": "train",
    "environments": ["acme/math"],
    "model": "m",
    "config": {"lr": 1e-4},
    "team_id": "team-a",
    "training": pr.TrainingSpec(max_steps=100, batch_size=8, wandb_project="rl"),
}
KEYS = list(STORED_EVAL)


@pytest.mark.parametrize("stored", [STORED_EVAL, STORED_TRAIN], ids=["eval", "train"])
def test_a_stored_spec_reads_back_and_is_stored_again_to_the_byte(stored: dict[str, Any]) -> None:
    spec = RunSpec.from_json(json.loads(json.dumps(stored)))
    again = spec.to_json()
    assert again == stored and list(again) == list(stored)
    assert records.encode_record(again) == records.encode_record(stored)
    assert RunSpec.from_json(again) == spec


def test_the_fields_read_from_a_stored_spec() -> None:
    spec = RunSpec.from_json(STORED_EVAL)
    assert spec.kind == "eval" and spec.mode == "offline" and spec.traces_opt_out is False
    assert spec.environments == (
        SpecEnvironment(name="gsm8k"),
        SpecEnvironment(slug="acme/math"),
        SpecEnvironment(id="env-1", version_id="v2"),
    )
    assert spec.tags == ("nightly", "gsm8k")
    assert spec.config["sampling"] == {"top_p": 0.9, "stop": ["</s>"]}
    assert RunSpec.from_json(STORED_TRAIN).training == {
        "max_steps": 100,
        "batch_size": 8,
        "wandb_project": "rl",
    }


@pytest.mark.parametrize(
    ("arguments", "stored"),
    [(INIT_EVAL, STORED_EVAL), (INIT_TRAIN, STORED_TRAIN)],
    ids=["eval", "train"],
)
def test_init_stores_the_spec_the_previous_release_stored(
    arguments: dict[str, Any],
    stored: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(mode="offline", runs_dir=runs, **arguments)
    path = run.journal_path
    run.finish()
    assert path is not None
    with Journal.open(path, owner=False) as journal:
        assert journal.get_meta("spec") == stored
        [opened] = journal.read(
            0, kinds={EntryKind.RUN_OPEN}, max_entries=10, max_bytes=1 << 20
        ).entries
    assert opened.payload == records.encode_record(stored)


def test_missing_or_null_keys_take_the_defaults() -> None:
    defaults = RunSpec()
    assert RunSpec.from_json({}) == defaults
    assert RunSpec.from_json(dict.fromkeys(KEYS)) == defaults
    assert defaults.kind == "eval" and defaults.frontend_url == "" and not defaults.traces_opt_out
    assert defaults.environments == () and defaults.tags == () and defaults.config == {}
    assert defaults.name is None and defaults.mode is None and defaults.training is None
    partial = RunSpec.from_json({"kind": "train", "attach_id": "rft-1", "unknown": [1]})
    assert partial == RunSpec(kind="train", attach_id="rft-1")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        # strings
        ({"name": 5}, "spec.name"),
        ({"model": ["m"]}, "spec.model"),
        ({"frontend_url": {"u": 1}}, "spec.frontend_url"),
        ({"attach_id": True}, "spec.attach_id"),
        ({"kind": "evaluation"}, "spec.kind"),
        ({"mode": 1}, "spec.mode"),
        # lists, and what they hold
        ({"tags": "nightly"}, "spec.tags"),
        ({"tags": ["ok", 2]}, r"spec.tags\[1\]"),
        ({"environments": {"name": "gsm8k"}}, "spec.environments"),
        ({"environments": ["gsm8k"]}, r"spec.environments\[0\]"),
        ({"environments": [{"name": "a"}, {"slug": 7}]}, r"spec.environments\[1\].slug"),
        ({"environments": [{"version_id": "v"}]}, r"spec.environments\[0\] needs"),
        # mappings
        ({"config": ["lr", 1]}, "spec.config"),
        ({"training": "max_steps=5"}, "spec.training"),
        # a flag
        ({"traces_opt_out": "yes"}, "spec.traces_opt_out"),
        ({"traces_opt_out": 1}, "spec.traces_opt_out"),
    ],
)
def test_a_value_of_the_wrong_type_is_a_spec_error_naming_its_field(
    changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError, match=field):
        RunSpec.from_json({**STORED_EVAL, **changes})


@pytest.mark.parametrize("value", [[STORED_EVAL], "spec", 3, True])
def test_a_spec_that_is_not_an_object_is_a_spec_error(value: Any) -> None:
    with pytest.raises(SpecError, match="spec must be an object"):
        RunSpec.from_json(value)


def test_a_spec_error_is_a_journal_error() -> None:
    """What reads a journal already handles JournalError (``primeruns replay``
    reports it, the uplink leaves a predecessor it cannot read for replay)."""
    assert issubclass(SpecError, pr.JournalError)


def _mutated(changes: dict[str, Any]) -> dict[str, Any]:
    return {**STORED_EVAL, **changes}


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        json_values(),
        st.dictionaries(st.sampled_from(KEYS), json_values(12), max_size=6).map(_mutated),
    )
)
def test_any_json_value_is_a_spec_or_a_spec_error(value: Any) -> None:
    try:
        spec = RunSpec.from_json(value)
    except SpecError as exc:
        assert str(exc).startswith("spec")
        return
    stored = spec.to_json()
    assert RunSpec.from_json(json.loads(json.dumps(stored))) == spec


def test_a_journal_without_a_spec_reads_as_the_defaults_and_a_damaged_one_raises(
    tmp_path: Path,
) -> None:
    with Journal.create(tmp_path / "runs", local_id="bare") as journal:
        assert journal_spec(journal) == RunSpec()
        journal.set_meta("spec", {**STORED_EVAL, "tags": "oops"})
        with pytest.raises(SpecError, match=r"spec\.tags"):
            journal_spec(journal)
        assert spec_or_default(journal) == RunSpec()
        journal.set_meta("spec", {})
        with pytest.raises(SpecError, match=r"spec\.kind"):
            journal_spec(journal)
        journal.set_meta("spec", STORED_TRAIN)
        assert journal_spec(journal) == RunSpec.from_json(STORED_TRAIN)


def test_a_listing_reads_a_missing_or_damaged_spec_as_none() -> None:
    assert listed_spec({}) is None
    assert listed_spec({"spec": None}) is None
    assert listed_spec({"spec": ["not", "a", "spec"]}) is None
    assert listed_spec({"spec": {**STORED_EVAL, "environments": "gsm8k"}}) is None
    # init() has always stored the kind: a spec naming none is damage, not an
    # evaluation's (a training run's records would ship to its sinks).
    assert listed_spec({"spec": {}}) is None
    assert listed_spec({"spec": {**STORED_TRAIN, "kind": None}}) is None
    assert listed_spec({"spec": STORED_EVAL}) == RunSpec.from_json(STORED_EVAL)


# The text keys a listing row keeps of a spec (summary_index), and the others.
TEXT_KEYS = ["kind", "name", "mode", "attach_id", "base_url", "run_key", "frontend_url", "model"]


def _read(value: Any) -> RunSpec | str:
    """The spec ``value`` reads as, or the error it raises, said."""
    try:
        return RunSpec.from_json(value)
    except SpecError as exc:
        return f"SpecError: {exc}"


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(TEXT_KEYS),
        st.one_of(
            st.none(),
            st.sampled_from(["eval", "train", "online", "offline", "disabled", "", "x"]),
            json_values(4),
        ),
        max_size=6,
    )
)
def test_a_spec_of_text_keys_alone_reads_as_the_same_spec_with_any_other_key(
    value: dict[str, Any],
) -> None:
    """A spec of text keys alone (as a listing's row keeps it: ``ls`` reads one
    a journal) reads as it reads beside an empty list of tags, which no
    shortcut takes: the same spec, or the same error naming its field."""
    assert _read(value) == _read({**value, "tags": []})
