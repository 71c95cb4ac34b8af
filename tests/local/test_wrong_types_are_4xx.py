"""A field of the wrong type is refused where the contract types it, over loopback.

The platform validates a request against its model: a list for
``model_name`` or an object for ``batch_size`` is a 422 naming the field,
and nothing is stored. The local platform stored such a field as it came;
a list for an evaluation's model made every load of the runs page a 500
(its models are sorted for the filter), and the reads handed it on to
clients that model the answer (prime-evals). Rows an earlier version
stored so read back with null there.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from local_helpers import plant, served, stored_totals

from primeruns.local import LocalPlatform

KEY = "wrong-types-key"
RFT, EVALS = "/api/v1/rft", "/api/v1/evaluations"
RUN: dict[str, Any] = {"base_model": "m", "team_id": "t", "max_steps": 1}
EVAL: dict[str, Any] = {"run_id": "r"}

#: (method, path, body, the field the refusal names): ``{eval}`` is a fresh
#: evaluation's id. Each was stored (or taken with a 200) on main.
REFUSED_422: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "eval-model-a-list": ("POST", f"{EVALS}/", {**EVAL, "model_name": ["m"]}, "model_name"),
    "eval-dataset-an-object": ("POST", f"{EVALS}/", {**EVAL, "dataset": {"d": 1}}, "dataset"),
    "eval-framework-a-number": ("POST", f"{EVALS}/", {**EVAL, "framework": 7}, "framework"),
    "eval-description-a-bool": ("POST", f"{EVALS}/", {**EVAL, "description": True}, "description"),
    "eval-task-type-a-list": ("POST", f"{EVALS}/", {**EVAL, "task_type": ["t"]}, "task_type"),
    "eval-run-id-an-object": ("POST", f"{EVALS}/", {"run_id": {"r": 1}}, "run_id"),
    "eval-suite-id-a-number": ("POST", f"{EVALS}/", {**EVAL, "suite_id": 7}, "suite_id"),
    "eval-is-public-a-list": ("POST", f"{EVALS}/", {**EVAL, "is_public": [False]}, "is_public"),
    "eval-environment-id-a-list": (
        "POST",
        f"{EVALS}/",
        {"environments": [{"id": ["e"]}]},
        "environments",
    ),
    "eval-environment-version-a-number": (
        "POST",
        f"{EVALS}/",
        {"environments": [{"id": "e", "version_id": 7}]},
        "environments",
    ),
    "eval-update-name-a-list": ("PUT", f"{EVALS}/{{eval}}", {"name": ["n"]}, "name"),
    "eval-update-model-an-object": ("PUT", f"{EVALS}/{{eval}}", {"model_name": {}}, "model_name"),
    "eval-update-tags-text": ("PUT", f"{EVALS}/{{eval}}", {"tags": "t"}, "tags"),
    "run-batch-size-a-list": (
        "POST",
        f"{RFT}/external-runs",
        {**RUN, "batch_size": [8]},
        "batch_size",
    ),
    "run-rollouts-a-fraction": (
        "POST",
        f"{RFT}/external-runs",
        {**RUN, "rollouts_per_example": 8.5},
        "rollouts_per_example",
    ),
    "run-seq-len-an-object": ("POST", f"{RFT}/external-runs", {**RUN, "seq_len": {}}, "seq_len"),
    "run-seq-len-past-64-bits": (
        "POST",
        f"{RFT}/external-runs",
        {**RUN, "seq_len": 2**64},
        "seq_len",
    ),
    "run-wandb-project-a-list": (
        "POST",
        f"{RFT}/external-runs",
        {**RUN, "wandb_project": ["p"]},
        "wandb_project",
    ),
    "run-wandb-entity-a-number": (
        "POST",
        f"{RFT}/external-runs",
        {**RUN, "wandb_entity": 7},
        "wandb_entity",
    ),
    "run-wandb-run-name-an-object": (
        "POST",
        f"{RFT}/external-runs",
        {**RUN, "wandb_run_name": {}},
        "wandb_run_name",
    ),
    "run-environment-id-a-number": (
        "POST",
        f"{RFT}/external-runs",
        {**RUN, "environments": [{"id": 7}]},
        "environments",
    ),
}


#: The reads of the planted rows: the runs page (sorting their models), their
#: pages, the lists and each.
OLD_ROWS_READ = ("/", "/dashboard/evaluations/eval_old", "/dashboard/training/rft_old")
OLD_ROWS_READ += (f"{EVALS}/", f"{EVALS}/eval_old", f"{RFT}/runs", f"{RFT}/runs/rft_old")


@pytest.fixture
def api(platform: LocalPlatform) -> Iterator[httpx.Client]:
    """A client of the module's platform (conftest's: any key is taken)."""
    with httpx.Client(base_url=platform.url, timeout=10) as client:
        yield client


@pytest.mark.parametrize("case", list(REFUSED_422))
def test_a_field_of_the_wrong_type_is_a_422_naming_it(api: httpx.Client, case: str) -> None:
    method, path, body, field = REFUSED_422[case]
    evaluation = api.post(f"{EVALS}/", json={**EVAL, "name": "kept"}).json()["evaluation_id"]
    before = stored_totals(api)
    r = api.request(method, path.format(eval=evaluation), json=body)
    assert r.status_code == 422, (case, r.status_code, r.text)
    assert field in r.json()["detail"], r.text
    assert stored_totals(api) == before
    assert api.get(f"{EVALS}/{evaluation}").json()["name"] == "kept"
    # The runs page reads every run (a 500 on main for a model that is a list).
    page = httpx.get(f"{api.base_url}/", headers=api.headers, timeout=30)
    assert page.status_code == 200, page.text[:500]


def test_the_contracts_types_are_taken(api: httpx.Client) -> None:
    """What the SDKs send, null included, is stored as before."""
    r = api.post(
        f"{EVALS}/",
        json={
            "name": "e",
            "environments": [{"id": "env", "version_id": "v"}, {"id": "env2", "version_id": None}],
            "model_name": "m",
            "dataset": "d",
            "framework": "verifiers",
            "description": None,
            "tags": ["a"],
            "is_public": False,
            "suite_id": "s",
            "task_type": "t",
        },
    )
    assert r.status_code == 201, r.text
    shown = api.get(f"{EVALS}/{r.json()['evaluation_id']}").json()
    assert (shown["model_name"], shown["dataset"], shown["framework"]) == ("m", "d", "verifiers")
    assert api.put(f"{EVALS}/{r.json()['evaluation_id']}", json={"name": "e2"}).status_code == 200
    r = api.post(
        f"{RFT}/external-runs",
        json={**RUN, "batch_size": 8, "seq_len": 2**63 - 1, "wandb_project": "p", "name": "n"},
    )
    assert r.status_code == 201, r.text
    assert (r.json()["run"]["batchSize"], r.json()["run"]["wandbProject"]) == (8, "p")


def test_rows_an_earlier_version_stored_with_wrong_types_read_back(tmp_path: Path) -> None:
    def insert(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO evaluations (id, name, status, request, team_id, created_at, updated_at)"
            " VALUES ('eval_old', 'old', 'RUNNING', ?, NULL, 0, 0)",
            ('{"run_id":["r"],"model_name":["m"],"dataset":{"d":1},"framework":7,"tags":"t"}',),
        )
        conn.execute(
            "INSERT INTO evaluations (id, name, status, request, team_id, created_at, updated_at)"
            " VALUES ('eval_new', 'new', 'RUNNING', ?, NULL, 1, 1)",
            ('{"run_id":"r","model_name":"gpt"}',),
        )
        conn.execute(
            "INSERT INTO train_runs (id, name, team_id, status, request, created_at, updated_at)"
            " VALUES ('rft_old', 'old', 't', 'RUNNING', ?, 0, 0)",
            ('{"base_model":["m"],"max_steps":"9","batch_size":{},"wandb_project":[1]}',),
        )

    with served(plant(tmp_path / "data", insert), KEY) as api:
        answers = {path: api.get(path) for path in OLD_ROWS_READ}
    for path, answer in answers.items():
        assert answer.status_code == 200, (path, answer.text[:500])
    evaluation = answers[f"{EVALS}/eval_old"].json()
    assert [evaluation[k] for k in ("model_name", "dataset", "framework")] == [None] * 3
    assert evaluation["tags"] == [] and evaluation["environment_names"] == []
    run = answers[f"{RFT}/runs/rft_old"].json()["run"]
    assert [run[k] for k in ("baseModel", "maxSteps", "batchSize", "wandbProject")] == [None] * 4


def test_environments_an_earlier_version_stored_with_wrong_types_read_back(
    tmp_path: Path,
) -> None:
    """An earlier version took an environment ref whose id was any value (a
    list, a number) and a run's environments of any shape: an evaluation's
    environments stored as a number made its reads and the runs page 500s,
    and refs of other types were handed on to clients modelling
    ``{id: str, version_id?: str}``. Now only such refs are shown."""
    refs = '[{"id":["e"]},{"id":"ok","version_id":7},"x",{"id":"v","version_id":"1"}]'

    def insert(conn: sqlite3.Connection) -> None:
        for name, envs in (("eval_num", "5"), ("eval_refs", refs)):
            conn.execute(
                "INSERT INTO evaluations (id, name, status, request, team_id, created_at,"
                " updated_at) VALUES (?, ?, 'RUNNING', ?, NULL, 0, 0)",
                (name, name, f'{{"run_id":"r","environments":{envs}}}'),
            )
        for name, envs in (("rft_num", "5"), ("rft_refs", refs)):
            conn.execute(
                "INSERT INTO train_runs (id, name, team_id, status, request, created_at,"
                " updated_at) VALUES (?, ?, 't', 'RUNNING', ?, 0, 0)",
                (name, name, f'{{"base_model":"m","environments":{envs}}}'),
            )

    reads = ("/", f"{EVALS}/", f"{RFT}/runs")
    reads += tuple(f"{EVALS}/{e}" for e in ("eval_num", "eval_refs"))
    reads += tuple(f"{RFT}/runs/{r}" for r in ("rft_num", "rft_refs"))
    reads += ("/dashboard/evaluations/eval_refs", "/dashboard/training/rft_refs")
    with served(plant(tmp_path / "data", insert), KEY) as api:
        answers = {path: api.get(path) for path in reads}
    for path, answer in answers.items():
        assert answer.status_code == 200, (path, answer.text[:500])
    assert answers[f"{EVALS}/eval_num"].json()["environment_ids"] == []
    assert answers[f"{EVALS}/eval_refs"].json()["environment_ids"] == ["ok", "v"]
    assert answers[f"{RFT}/runs/rft_num"].json()["run"]["environments"] == []
    shown = answers[f"{RFT}/runs/rft_refs"].json()["run"]["environments"]
    assert shown == [{"id": "ok", "version_id": None}, {"id": "v", "version_id": "1"}]
