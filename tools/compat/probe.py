"""One probe of the public API, printed one answer per line, for either SDK.

``python probe.py URL`` imports ``prime_runs`` (the vendor's ``prime-runs``
0.1.4 in its own virtual environment, or this project, which provides the
same import name) and asks it the same questions: values and their types,
what each call raises and which ``except`` clauses catch it. ``compare.py``
runs it under both interpreters against one local platform and compares the
answers line by line. Only the standard library and the SDK are imported, so
the vendor's interpreter can run it.

Runs that register use the local platform at URL (any key; the team
``team-outside`` is outside its training allowlist, ``compare.py`` starts it
so).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

import prime_runs as pr
import prime_traces

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:1"
KEY = "probe-key-0123456789"
# The names code written for the vendor's prime-runs 0.1.4 imports from the package.
VENDOR_ALL = {
    "APIError", "CONFIG_SOURCE_KEY", "ConfigSource", "ConfigurationError", "EnvironmentRef",
    "EnvironmentResolutionError", "ForbiddenError", "MODE_ENV", "NotFoundError",
    "PaymentRequiredError", "PrimeRunsError", "RetryableAPIError", "Run", "RunFinishedError",
    "RunKind", "RunStatus", "TRACES_OPT_OUT_ENV", "TrainingSpec", "TransportError",
    "UnauthorizedError", "init", "metrics", "projection",
}  # fmt: skip
CATCHERS = {
    "prime_traces.PrimeTracesError": prime_traces.PrimeTracesError,
    "prime_traces.APIError": prime_traces.APIError,
    "prime_traces.ForbiddenError": prime_traces.ForbiddenError,
    "prime_runs.APIError": pr.APIError,
    "prime_runs.ForbiddenError": pr.ForbiddenError,
    "prime_runs.PrimeRunsError": pr.PrimeRunsError,
    "prime_runs.ConfigurationError": pr.ConfigurationError,
    "ValueError": ValueError,
    "TypeError": TypeError,
}


def shown(value: Any) -> str:
    """A value as a stable line: no addresses, ids or times."""
    if isinstance(value, bool | int | float | str | type(None)):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, list | tuple):
        return f"{type(value).__name__} [{', '.join(shown(v) for v in value)}]"
    if isinstance(value, dict):
        items = ", ".join(f"{k!r}: {shown(v)}" for k, v in sorted(value.items()))
        return f"{type(value).__name__} {{{items}}}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(
            f"{f.name}={shown(getattr(value, f.name))}" for f in dataclasses.fields(value)
        )
        return f"{type(value).__name__}({fields})"
    return type(value).__name__


def answer(fn: Callable[[], Any]) -> str:
    try:
        return shown(fn())
    except Exception as exc:  # the probe reports what is raised, whatever it is
        caught = [name for name, cls in CATCHERS.items() if isinstance(exc, cls)]
        return f"raises {type(exc).__name__} caught by {', '.join(caught) or 'none of the above'}"


def _set(obj: Any, name: str, value: Any) -> Any:
    setattr(obj, name, value)
    return getattr(obj, name)


def _disabled(**kwargs: Any) -> Any:
    return pr.init(mode="disabled", **kwargs)


def _live_mapping(attr: str) -> Any:
    run = _disabled(name="probe", config={"a": 1})
    getattr(run, attr)["edited"] = 2
    return getattr(run, attr)


def _team_outside() -> Any:
    run = pr.init(
        kind="train",
        model="m",
        team_id="team-outside",
        api_key=KEY,
        base_url=URL,
        training=pr.TrainingSpec(max_steps=1),
        on_error="raise",
    )
    run.finish()
    return run.status


def _url_shape(url: Any, run_id: str) -> Any:
    """A run URL with this run's origin and id replaced, so runs compare."""
    if not isinstance(url, str):
        return url
    return url.replace(URL.rsplit("/api/", 1)[0], "{local origin}").replace(run_id, "{id}")


def _registered(kind: str) -> Any:
    extra: dict[str, Any] = (
        {"kind": "train", "team_id": "team-a", "training": pr.TrainingSpec(max_steps=2)}
        if kind == "train"
        else {"environments": ["gsm8k"]}
    )
    run = pr.init(name=f"probe-{kind}", model="m", api_key=KEY, base_url=URL, **extra)
    before = [run.status, run.kind, run.finished, run.mode, _url_shape(run.url, run.id)]
    run.update_summary({"score": 0.5})
    run.finish()
    return [*before, run.status, run.finished, run.failed_records, run.dropped_records]


def probes() -> dict[str, Callable[[], Any]]:
    return {
        "APIError is prime_traces.APIError": lambda: pr.APIError is prime_traces.APIError,
        "ForbiddenError is prime_traces'": lambda: pr.ForbiddenError is prime_traces.ForbiddenError,
        "APIError derives from PrimeRunsError": lambda: issubclass(pr.APIError, pr.PrimeRunsError),
        "vendor names missing from __all__": lambda: sorted(VENDOR_ALL - set(pr.__all__)),
        "RunStatus('completed').is_terminal()": lambda: pr.RunStatus("completed").is_terminal(),
        "RunStatus.RUNNING.is_terminal()": lambda: pr.RunStatus.RUNNING.is_terminal(),
        "str(RunStatus.FAILED)": lambda: str(pr.RunStatus.FAILED),
        "RunStatus.FAILED == 'failed'": lambda: pr.RunStatus.FAILED == "failed",
        "ConfigSource.from_mapping(text)": lambda: pr.ConfigSource.from_mapping(
            {"text": "a = 1", "format": "toml"}
        ),
        "ConfigSource.from_mapping(no text)": lambda: pr.ConfigSource.from_mapping({"x": 1}),
        "ConfigSource.coerce(None)": lambda: pr.ConfigSource.coerce(None),
        "ConfigSource.coerce(instance)": lambda: pr.ConfigSource.coerce(pr.ConfigSource("t")),
        "ConfigSource.coerce(missing path)": lambda: pr.ConfigSource.coerce("/nonexistent/x.toml"),
        "ConfigSource.coerce(3)": lambda: pr.ConfigSource.coerce(3),
        "EnvironmentRef settable": lambda: _set(pr.EnvironmentRef(name="x"), "name", "y"),
        "ConfigSource settable": lambda: _set(pr.ConfigSource("t"), "text", "u"),
        "TrainingSpec settable": lambda: _set(pr.TrainingSpec(), "max_steps", 3),
        "TrainingSpec(max_steps=-1)": lambda: pr.TrainingSpec(max_steps=-1),
        "EnvironmentRef(slug='a/b/c')": lambda: pr.EnvironmentRef(slug="a/b/c"),
        "EnvironmentRef(slug='ab')": lambda: pr.EnvironmentRef(slug="ab"),
        "EnvironmentRef()": lambda: pr.EnvironmentRef(),
        "EnvironmentRef.coerce('o/n')": lambda: pr.EnvironmentRef.coerce("o/n"),
        "EnvironmentRef.coerce(3)": lambda: pr.EnvironmentRef.coerce(3),
        "Run.reset_after_fork exists": lambda: callable(getattr(pr.Run, "reset_after_fork", None)),
        "models.RunSpec, RunHandle, RUN_KIND": lambda: (
            [hasattr(pr.models, n) for n in ("RunSpec", "RunHandle", "RUN_KIND")]
            if hasattr(pr, "models")
            else __import__("prime_runs.models").models.RUN_KIND
        ),
        "projection.encode_json exists": lambda: callable(
            getattr(pr.projection, "encode_json", None)
        ),
        "init(kind='bogus')": lambda: _disabled(kind="bogus"),
        "init(training=) on an eval": lambda: _disabled(training=pr.TrainingSpec()),
        "init(on_error='bogus')": lambda: _disabled(on_error="bogus").mode,
        "init(tags='x')": lambda: _disabled(tags="x").mode,
        "init(finish_timeout=None)": lambda: _disabled(finish_timeout=None).mode,
        "init(mode='bogus')": lambda: pr.init(mode="bogus"),
        "disabled run: status, kind, finished": lambda: [
            (r := _disabled(name="p")).status,
            r.kind,
            r.finished,
            r.url,
            r.mode,
        ],
        "disabled run: finish, then status": lambda: [
            (r := _disabled(name="p")).finish(),
            r.status,
            r.finished,
        ],
        "disabled run: log after finish": lambda: [
            (r := _disabled(name="p")).finish(),
            r.log_metrics({"a": 1}),
        ],
        "run.config is live": lambda: _live_mapping("config"),
        "run.summary is live": lambda: _live_mapping("summary"),
        "team outside the training allowlist": _team_outside,
        "an evaluation on the platform, before and after finish": lambda: _registered("eval"),
        "a training run on the platform, before and after finish": lambda: _registered("train"),
    }


def main() -> int:
    os.environ.pop("PRIME_API_KEY", None)
    for label, fn in probes().items():
        print(f"{label} => {answer(fn)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
