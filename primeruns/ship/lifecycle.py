"""A run's life on the platform: register, update, finalize (contract §2, §3, §7.1).

The run's spec and its platform binding live in the journal's meta, so the
same code registers a live run at ``init()``, a run whose platform was down at
``init()`` once it is back, an offline run at ``primeruns sync`` and a crashed
run at ``primeruns replay``. Every step records its outcome in the journal
before the next, so a crash between steps repeats nothing that succeeded.

Registration is not replayable (a resend could register a second run), so
only failures that surely did not reach the server are retried at once.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import (
    APIError,
    EnvironmentResolutionError,
    ForbiddenError,
    LineFormatConflictError,
    PaymentRequiredError,
    RetryableAPIError,
    UnauthorizedError,
    is_transient,
)
from ..journal import Journal
from ..platform import PlatformClient, is_ambiguous
from ..sinks.base import Binding
from .policy import RetryPolicy

__all__ = ["Lifecycle", "crash_reason", "status_message"]

log = logging.getLogger("primeruns.lifecycle")

# Authorization failures are about the key, not the environment: they surface as such.
_AUTH_ERRORS = (UnauthorizedError, ForbiddenError, PaymentRequiredError)
_EVAL_STATUS = {"failed": "FAILED", "cancelled": "CANCELLED", "crashed": "FAILED"}
_ERROR_MESSAGE_CAP = 4096


def crash_reason(error: str | None) -> str:
    return f"crashed: {error or 'crashed'}"


def status_message(status: str, error: str | None) -> str | None:
    """The error message the platform records for a terminal status."""
    if status == "completed":
        return None
    if status == "cancelled":
        return f"cancelled: {error or 'cancelled'}"
    if status == "crashed":
        return crash_reason(error)
    return error or "failed"


class Lifecycle:
    """Registers and closes out one journal's run. Thread-safe: registration
    and finalization are serialized, so a background retry and ``finish()``
    can never register the run twice."""

    def __init__(
        self,
        journal: Journal,
        client: PlatformClient,
        *,
        policy: RetryPolicy,
        on_failure: Callable[[str, BaseException], None],
    ) -> None:
        self.journal = journal
        self.client = client
        self._policy = policy
        self._on_failure = on_failure
        self._rng = random.Random()
        self._lock = threading.RLock()

    # -- state in the journal ----------------------------------------------
    @property
    def spec(self) -> dict[str, Any]:
        spec = self.journal.get_meta("spec", {})
        return spec if isinstance(spec, dict) else {}

    def binding(self) -> Binding | None:
        bound = self.journal.get_meta("platform")
        if not isinstance(bound, dict) or not bound.get("run_id"):
            return None
        return Binding(run_id=str(bound["run_id"]), kind=str(bound["kind"]), url=bound.get("url"))

    @property
    def finalized(self) -> bool:
        return bool(self.journal.get_meta("finalized"))

    # -- calls -------------------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        replayable: bool = True,
        attempts: int | None = None,
    ) -> dict[str, Any]:
        """One platform call with retries on transient failures."""
        tries = attempts or self._policy.attempts_per_strike
        for attempt in range(tries):
            try:
                return self.client.api(method, path, body)
            except APIError as exc:
                last_try = attempt + 1 >= tries
                if not is_transient(exc) or last_try or (not replayable and is_ambiguous(exc)):
                    raise
                retry_after = exc.retry_after if isinstance(exc, RetryableAPIError) else None
                time.sleep(self._policy.delay(attempt, retry_after, self._rng))
        raise AssertionError("unreachable")

    def register(self, *, attempts: int | None = None) -> Binding:
        """Create the run on the platform (or bind an attached id) and record it."""
        with self._lock:
            return self._register(attempts)

    def _register(self, attempts: int | None) -> Binding:
        bound = self.binding()
        if bound is not None:
            return bound
        spec = self.spec
        kind = str(spec.get("kind", "eval"))
        frontend = str(spec.get("frontend_url", "")).rstrip("/")
        attach = spec.get("attach_id")
        if attach:
            run_id, name, url = str(attach), spec.get("name"), None
        elif kind == "train":
            body = self._train_body(spec)
            created = self._call(
                "POST", "/rft/external-runs", body, replayable=False, attempts=attempts
            )
            run = _as_dict(created.get("run"))
            if not run.get("id"):
                raise APIError("the platform created a training run but returned no id")
            run_id, name, url = str(run["id"]), run.get("name") or spec.get("name"), None
        else:
            body = self._eval_body(spec, attempts)
            created = self._call("POST", "/evaluations/", body, replayable=False, attempts=attempts)
            if not created.get("evaluation_id"):
                raise APIError("the platform created an evaluation but returned no evaluation_id")
            run_id = str(created["evaluation_id"])
            name, url = created.get("name") or spec.get("name"), created.get("viewer_url")
        if not url:
            section = "training" if kind == "train" else "evaluations"
            url = f"{frontend}/dashboard/{section}/{run_id}"
        binding = Binding(run_id=run_id, kind=kind, url=url)
        self.journal.set_meta(
            "platform",
            {
                "run_id": run_id,
                "kind": kind,
                "url": url,
                "name": name,
                "base_url": self.client.settings.api_root,
                "attached": bool(attach),
            },
        )
        return binding

    def _resolve_environments(
        self, spec: Mapping[str, Any], attempts: int | None
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        team = spec.get("team_id")
        for ref in spec.get("environments") or []:
            try:
                if ref.get("id"):
                    env_id = ref["id"]
                elif ref.get("slug"):
                    owner, _, name = str(ref["slug"]).partition("/")
                    data = self._call(
                        "GET", f"/environmentshub/{owner}/{name}/@latest", attempts=attempts
                    )
                    inner = _as_dict(data.get("data")) or data
                    env_id = inner.get("id")
                else:
                    body = {"name": ref["name"], **({"team_id": team} if team else {})}
                    data = self._call("POST", "/environmentshub/resolve", body, attempts=attempts)
                    inner = _as_dict(data.get("data"))
                    env_id = inner.get("id")
            except APIError as exc:
                if is_transient(exc) or isinstance(exc, _AUTH_ERRORS):
                    raise
                raise EnvironmentResolutionError(
                    f"environments: could not resolve {_ref_text(ref)}: {exc}"
                ) from exc
            if not env_id:
                raise EnvironmentResolutionError(
                    f"environments: the hub returned no id for {_ref_text(ref)}"
                )
            entry = {"id": str(env_id)}
            if ref.get("version_id"):
                entry["version_id"] = ref["version_id"]
            out.append(entry)
        return out

    def _eval_body(self, spec: Mapping[str, Any], attempts: int | None) -> dict[str, Any]:
        environments = self._resolve_environments(spec, attempts)
        if not environments:
            raise EnvironmentResolutionError(
                "environments: an evaluation needs at least one environment; pass "
                "environments=['name'] (resolved through the hub) or [{'id': ...}]"
            )
        body: dict[str, Any] = {
            "name": spec.get("name"),
            "environments": environments,
            "tags": list(spec.get("tags") or []),
            "model_name": spec.get("model"),
            "dataset": spec.get("dataset"),
            "framework": spec.get("framework"),
            "description": spec.get("description"),
            "metadata": spec.get("config") or None,
            "team_id": spec.get("team_id"),
        }
        return {k: v for k, v in body.items() if v is not None or k == "tags"}

    def _train_body(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        environments = []
        for ref in spec.get("environments") or []:
            entry = {"id": ref.get("id") or ref.get("slug") or ref.get("name")}
            if ref.get("version_id"):
                entry["version_id"] = ref["version_id"]
            environments.append(entry)
        body: dict[str, Any] = {
            "base_model": spec.get("model"),
            "environments": environments,
            "team_id": spec.get("team_id"),
            "name": spec.get("name"),
            "run_config": spec.get("config") or None,
        }
        body.update(spec.get("training") or {"max_steps": 0})
        return {k: v for k, v in body.items() if v is not None}

    # -- close-out -------------------------------------------------------------
    def finalize(self, status: str, error: str | None, summary: Mapping[str, Any]) -> None:
        """Send the run's terminal state (once; a repeat is a no-op)."""
        with self._lock:
            self._finalize(status, error, summary)

    def _finalize(self, status: str, error: str | None, summary: Mapping[str, Any]) -> None:
        if self.finalized:
            return
        binding = self.register()
        spec = self.spec
        attached = bool(spec.get("attach_id"))
        if binding.kind == "train":
            self._finalize_train(binding.run_id, status, error, attached)
        else:
            self._finalize_eval(binding.run_id, status, error, summary, spec, attached)
        self.journal.set_meta("finalized", {"status": status, "at": time.time()})

    def _step(self, what: str, call: Callable[[], Any]) -> None:
        try:
            call()
        except LineFormatConflictError:  # 409: already closed; the outcome is recorded
            log.info("%s: the run was already closed", what)
        except APIError as exc:
            self._on_failure(what, exc)

    def _finalize_eval(
        self,
        run_id: str,
        status: str,
        error: str | None,
        summary: Mapping[str, Any],
        spec: Mapping[str, Any],
        attached: bool,
    ) -> None:
        path = f"/evaluations/{run_id}"
        update: dict[str, Any] = {}
        if spec.get("config") and not attached:
            update["metadata"] = spec["config"]
        if summary:
            update["metrics"] = dict(summary)
        if update:
            self._step("update", lambda: self._call("PUT", path, update))
        if status == "completed":
            metrics = {"metrics": dict(summary)}
            self._step("finalize", lambda: self._call("POST", f"{path}/finalize", metrics))
            return
        if attached:
            return  # the launcher owns a failed attached run's status
        body: dict[str, Any] = {"status": _EVAL_STATUS.get(status, "FAILED")}
        message = status_message(status, error) if status == "crashed" else error
        if message:
            body["error_message"] = message[:_ERROR_MESSAGE_CAP]
        self._step("finalize", lambda: self._call("PUT", path, body))

    def _finalize_train(self, run_id: str, status: str, error: str | None, attached: bool) -> None:
        if status == "completed":
            try:
                self._call("POST", "/rft/finalize", {"run_id": run_id, "exit_code": 0})
            except APIError:
                body = {"status": "completed"}
                self._step(
                    "finalize",
                    lambda: self._call("PUT", f"/rft/external-runs/{run_id}/status", body),
                )
            return
        if attached:
            return
        body = {"status": "failed", "error_message": status_message(status, error) or "failed"}
        self._step(
            "finalize", lambda: self._call("PUT", f"/rft/external-runs/{run_id}/status", body)
        )


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _ref_text(ref: Mapping[str, Any]) -> str:
    for key in ("slug", "name", "id"):
        if ref.get(key):
            return f"{key}={ref[key]!r}"
    return repr(dict(ref))
