"""``init()``: its arguments checked and resolved, the journal created, and an
online run registered and handed to its uplink.

Bad arguments raise here, naming the argument and the fix; the run handle
itself (:class:`primeruns.run.Run`) never sees an unchecked value.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, cast

from primeruns.logs import get_logger

from . import hooks, records, run_index
from .exceptions import ConfigurationError
from .forkchild import ForkOrigin
from .journal import EntryKind, Journal, delete_journal, in_memory, list_journals
from .models import (
    CONFIG_SOURCE_KEY,
    ConfigSource,
    EnvironmentRef,
    OnError,
    RunKind,
    TrainingSpec,
)
from .ranks import K_ROLE, claim_created, primary_from_env, resolve_role
from .recorder import Recorder
from .refuge import create_journal
from .run import Run
from .settings import resolve_run_settings
from .ship.link import UplinkThreads
from .spec import SPEC_KEY, RunSpec, SpecEnvironment, listed_spec
from .supervisor import Supervisor, go_online
from .threads import start_daemon
from .timeouts import given_seconds, shown

__all__ = ["init"]

log = get_logger("primeruns")

_DEFAULT_FINISH_TIMEOUT = 300.0


def _check_type(name: str, value: Any, types: type | tuple[type, ...], hint: str) -> None:
    if value is not None and not isinstance(value, types):
        raise TypeError(f"init: {name} must be {hint}, got {type(value).__name__} ({value!r:.80})")


def _is_unicode(text: str) -> bool:
    """Whether ``text`` holds no lone surrogate (it encodes as UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _normalize_config(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, ConfigSource):
        return {CONFIG_SOURCE_KEY: config.to_dict()}
    if isinstance(config, str | os.PathLike):
        return {CONFIG_SOURCE_KEY: ConfigSource.from_file(config).to_dict()}
    if isinstance(config, Mapping):
        try:
            decoded = json.loads(records.encode_record(config, what="config"))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"init: config could not be encoded as JSON: {exc}") from exc
        return dict(decoded)
    raise TypeError(
        f"init: config must be a path to the config file, a ConfigSource or a mapping, "
        f"got {type(config).__name__}"
    )


def _memory_journal(max_bytes: int, meta: dict[str, Any]) -> Journal:
    """The same interface, kept in memory (journal.memory): typed as a Journal.
    Imported here, in ``init()``'s thread, by the rare run no folder takes."""
    from .journal.memory import MemoryJournal

    return cast(Journal, MemoryJournal(max_bytes=max_bytes, meta=meta))


def init(
    name: str | None = None,
    environments: Sequence[Any] | None = None,
    model: str | None = None,
    framework: str | None = None,
    description: str | None = None,
    tags: Sequence[str] | None = None,
    config: Any = None,
    *,
    mode: str | None = None,
    team_id: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    on_error: OnError = "warn",
    finish_timeout: float | None = None,
    kind: RunKind = "eval",
    id: str | None = None,
    training: TrainingSpec | None = None,
    traces_opt_out: bool | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    durability: Literal["process", "fsync"] = "process",
    max_journal_bytes: int | None = None,
    run_key: str | None = None,
    primary: bool | None = None,
) -> Run:
    """Open a run and return its handle.

    Online, the run is registered at once so ``run.url`` is there; if the
    platform cannot be reached the run goes on journaling and registers when
    it can (``run.url`` is None until then). 401/403 and an environment that
    cannot be resolved raise here. Raises ``ConfigurationError``, ``TypeError``
    or ``ValueError`` for bad arguments, naming the argument. An online run
    whose runs directory cannot take its journal (a read-only home) journals
    in a private folder elsewhere with one warning (:mod:`primeruns.refuge`).

    ``run_key``: one run logged by several journals in turn, such as a job
    requeued on another node while offline (for example the scheduler's job
    id): ``primeruns sync`` ships every journal with the key into one platform
    run, closed by the journal that finishes it.

    ``primary``: several processes attached to one run (ranks): whether this
    one closes the run (:mod:`primeruns.ranks`). By default
    ``PRIME_RUNS_PRIMARY``, else the run's creator, else rank 0 of ``RANK``
    or ``SLURM_PROCID``, else the first process on this host to attach it.
    The others' ``finish()`` ships their records and leaves the run open.
    """
    _check_type("name", name, str, "a string")
    _check_type("model", model, str, "a string")
    _check_type("framework", framework, str, "a string")
    _check_type("description", description, str, "a string")
    _check_type("team_id", team_id, str, "a string")
    _check_type("api_key", api_key, str, "a string")
    _check_type("base_url", base_url, str, "a string")
    _check_type("id", id, str, "a string")
    if id is not None and not _is_unicode(id):
        # A platform run's id is matched exactly (journals, lock files, URLs):
        # repaired, as other text is, it would name some other run.
        raise ConfigurationError(
            f"init: id holds text that is not valid Unicode (lone surrogates: bytes "
            f"decoded from the environment?), {id!r:.80}: pass the platform run's id as it is"
        )
    _check_type("run_key", run_key, str, "a string")
    _check_type("primary", primary, bool, "True or False")
    if run_key is not None and id is not None:
        raise ConfigurationError(
            "init: pass run_key= (a run logged offline by successive jobs) or id= (attach "
            "to a run the platform has), not both"
        )
    _check_type("training", training, TrainingSpec, "a pr.TrainingSpec")
    _check_type("traces_opt_out", traces_opt_out, bool, "True or False")
    _check_type("mode", mode, str, "'online', 'offline' or 'disabled'")
    _check_type(
        "environments",
        environments,
        (list, tuple, str, Mapping, EnvironmentRef),
        "a list of names, 'owner/name' slugs, mappings or pr.EnvironmentRef",
    )
    _check_type("runs_dir", runs_dir, (str, os.PathLike), "a path")
    if kind not in ("eval", "train"):
        raise ConfigurationError(f"init: kind must be 'eval' or 'train', got {kind!r}")
    # on_error, finish_timeout and tags are taken as the vendor's SDK takes
    # them, with a warning naming the fix: code written for it that passes
    # on_error="ignore" or finish_timeout="30" ran there, and an error here
    # would leave the caller (verifiers) a disabled run that keeps nothing.
    # Text first: a value's own == may raise (a numpy array's is ambiguous).
    if not isinstance(on_error, str) or on_error not in ("warn", "raise"):
        _taken_as("on_error", on_error, "warn", "pass 'warn' or 'raise'")
        on_error = "warn"
    if durability not in ("process", "fsync"):
        raise ValueError(f"init: durability must be 'process' or 'fsync', got {durability!r}")
    finish_timeout = _finish_timeout(finish_timeout)
    if training is not None and kind != "train":
        raise ConfigurationError("init: training= is only for kind='train'")
    tags = _tags(tags)
    if isinstance(environments, str | Mapping):
        environments = [environments]
    # What a disabled run would refuse is raised below unless the run is
    # disabled: callers (verifiers) open a disabled run, unguarded, when
    # opening theirs raised, with the same identity; it stores nothing and
    # resolves no environment, so it keeps the config mapping as given and
    # the environments it can read, and warns.
    refused: list[TypeError | ValueError] = []
    envs: list[EnvironmentRef] = []
    for entry in environments or []:
        try:
            envs.append(EnvironmentRef.coerce(entry))
        except (TypeError, ValueError) as exc:
            refused.append(exc)
    try:
        config_doc = _normalize_config(config)
    except TypeError as exc:
        if not isinstance(config, Mapping):
            raise
        config_doc = dict(config)
        refused.append(exc)

    # Every setting, resolved once (primeruns.settings): strictly, except for
    # a disabled run, which uses none of them and only warns about a bad one.
    resolved = resolve_run_settings(
        mode=mode,
        api_key=api_key,
        base_url=base_url,
        team_id=team_id,
        traces_opt_out=traces_opt_out,
        runs_dir=runs_dir,
        max_journal_bytes=max_journal_bytes,
    )
    settings, run_mode, tuning = resolved.platform, resolved.mode, resolved.sdk
    if refused and run_mode != "disabled":
        raise refused[0]
    for refusal in refused:
        log.warning("prime-runs: %s (ignored: a disabled run stores nothing)", refusal)
    if kind == "eval" and not name:
        stem = envs[0].display_name if envs else (framework or "eval")
        name = f"{stem}-{secrets.token_hex(4)}"

    if run_mode == "disabled":
        return Run(
            Recorder(None, kind=kind, on_error=on_error),
            mode="disabled",
            name=name,
            config=config_doc,
            finish_timeout=float(finish_timeout),
            attached=False,  # it keeps the id, but continues no platform run (as the vendor's)
            local_id=id or f"disabled-{secrets.token_hex(8)}",
        )

    if kind == "eval" and id is None and not envs:
        # Online the create would refuse it anyway; offline it was accepted and
        # then could never be synced: say so now, while the fix is cheap.
        raise ConfigurationError(
            "init: an evaluation needs environments=[...] (hub names, 'owner/name' slugs "
            "or {'id': ...}): without one it cannot be registered, now or by primeruns sync"
        )
    if kind == "train" and id is None:
        if not model:
            raise ConfigurationError("init: a training run needs model= (the base model)")
        if not settings.team_id:
            raise ConfigurationError(
                "init: a training run needs a team: pass team_id=... or set PRIME_TEAM_ID"
            )
    if kind == "train" and settings.traces_opt_out and not _parquet_available():
        raise ConfigurationError(
            "init: this training run opted out of Prime Traces, so its samples go to the "
            "Parquet sample table, which needs pyarrow: pip install 'prime-runs[train]'"
        )

    spec = RunSpec(
        kind=kind,
        name=name,
        environments=tuple(SpecEnvironment.from_ref(e) for e in envs),
        dataset=envs[0].display_name if envs else None,
        model=model,
        framework=framework,
        description=description,
        tags=tuple(tags or ()),
        config=config_doc,
        team_id=settings.team_id,
        training=(training or TrainingSpec()).to_body() if kind == "train" else None,
        attach_id=id,
        frontend_url=settings.frontend_url,
        base_url=settings.api_root,
        traces_url=settings.traces_url,
        traces_opt_out=settings.traces_opt_out,
        mode=run_mode,
        run_key=run_key or None,
    )
    stored = spec.to_json()
    meta = {SPEC_KEY: stored, "state": "running"}
    if primary is None:
        primary = primary_from_env()  # a bad value raises before anything is made
    journal = create_journal(
        tuning.runs_dir,
        lambda where: Journal.create(
            where, durability=durability, max_bytes=tuning.max_journal_bytes, meta=meta
        ),
        online=run_mode == "online",
        in_memory=lambda: _memory_journal(tuning.max_journal_bytes, meta),
    )
    memory = in_memory(journal)
    if memory:
        # Only threads of this process can read a journal in its memory.
        tuning = replace(tuning, uplink="threads")
    else:  # found by the look for its run's journals (ranks.others_of), not by a scan
        run_index.enter(journal.path, id)
    # Before the uplink starts: its close-out reads whether it closes the run.
    role = resolve_role(
        primary,
        attach_id=id,
        runs_dir=tuning.runs_dir if memory else journal.path.parent,
        local_id=journal.local_id,
        run_key=run_key or None,
        api_root=settings.api_root,
    )
    journal.set_meta(K_ROLE, role.to_json())
    journal.append(EntryKind.RUN_OPEN, [records.encode_record(stored, what="spec")], essential=True)
    recorder = Recorder(journal, kind=kind, on_error=on_error)
    supervisor: Supervisor | None = None
    made: Run | None = None
    try:
        if run_mode == "online":
            supervisor, taken_over = go_online(journal, settings, kind, recorder.note, tuning)
            if kind == "train" and isinstance(supervisor.uplink, UplinkThreads):
                # Shipping from threads, the sample table's first object would
                # import pyarrow (~0.2 s of CPU holding the GIL) beside the
                # loop's first steps: here instead, where the vendor's init
                # imports it. (The uplink process imports it in its own.)
                _parquet_available()
            if not memory:  # with no folder to write (memory) there are no other runs
                others = (journal.path.parent, {journal.path, *taken_over})
                start_daemon(_mention_crashed_runs, "primeruns-scan", others)
                bound = supervisor.binding()
                if id is None and role.primary and bound is not None:
                    claim_created(journal.path.parent, bound.run_id, journal.local_id)
        # What a forked child needs to log into this run (primeruns.forkchild):
        # its journal goes beside this one (in the fallback folder when the
        # runs directory refused it, refuge), or in its own memory as this
        # one's is.
        bound = supervisor.binding() if supervisor is not None else None
        fork = ForkOrigin(
            spec=spec,
            settings=settings,
            tuning=tuning if memory else replace(tuning, runs_dir=journal.path.parent),
            durability=durability,
            kind=kind,
            on_error=on_error,
            finish_timeout=float(finish_timeout),
            parent_id=journal.local_id,
            parent_path="" if memory else str(journal.path),
            mode=run_mode,
            run_id=bound.run_id if bound else None,
            in_memory=memory,
        )
        made = run = Run(
            recorder,
            supervisor=supervisor,
            mode=run_mode,
            name=name,
            config=config_doc,
            finish_timeout=float(finish_timeout),
            attached=id is not None,
            local_id=journal.local_id,
            fork=fork,
        )
        hooks.register(run)
        hooks.install_sigterm()
    except BaseException:
        _abandon(journal, supervisor, made, memory=memory)
        raise
    return run


def _abandon(
    journal: Journal, supervisor: Supervisor | None, run: Run | None, *, memory: bool
) -> None:
    """``init()`` failed once its journal was made: its handle is never
    returned, so nothing would finish the run. Its uplink is stopped (else
    its process waits for this one's death), its journal closed, and left
    for `primeruns replay` to close the run out if the platform registered
    it; deleted if not (the run never existed there: nothing for
    `primeruns ls` to call crashed)."""
    if run is not None:
        hooks.unregister(run)
    registered = False
    if supervisor is not None:
        try:
            supervisor.abandon()
        except Exception as exc:  # (the failure of init() is what is raised)
            log.warning("prime-runs: could not stop the uplink of a failed init(): %s", exc)
        registered = supervisor.binding() is not None
    journal.close()
    if not memory and not registered:
        delete_journal(journal.path)


def _parquet_available() -> bool:
    from .projection import parquet_available

    return parquet_available()


#: The crashed-run hint looks at this many of the latest earlier runs, and
#: opens at most ``_HINT_UNREAD_MOST`` of them (those without a current
#: summary: ``journal.summary``), so its work beside the user's loop is the
#: same with thousands of past runs as with a few, the first time too.
_HINT_NEWEST = 100
_HINT_UNREAD_MOST = 8


def _mention_crashed_runs(runs_dir: Path, skip: set[Path]) -> None:
    """Log one line naming earlier runs that were not shipped and closed out
    (off the init path), among the latest ``_HINT_NEWEST``: an older one was
    named by every run since it crashed. One that finished (its finish
    entry: its close-out did not reach the platform) is not called crashed."""
    try:
        crashed: list[str] = []
        finished: list[str] = []
        listed = list_journals(
            runs_dir,
            skip_live=True,
            skip=skip,
            unread_most=_HINT_UNREAD_MOST,
            newest=_HINT_NEWEST,
        )
        for info in listed:
            meta = info.meta
            if info.owner_alive or meta.get("finalized"):
                continue
            if meta.get("state") == "shipped" or meta.get("continued_by"):
                continue
            spec = listed_spec(meta)
            if spec is None or spec.mode != "online":
                continue
            (crashed if info.finish is None else finished).append(info.path.name)
    except Exception:  # a convenience: never let it disturb the run
        return
    said = [
        f"{len(names)} earlier run(s) in {runs_dir} {how} ({_some(names)})"
        for names, how in (
            (crashed, "crashed before they were shipped and closed out"),
            (finished, "finished but were not shipped and closed out"),
        )
        if names
    ]
    if said:
        log.warning(
            "prime-runs: %s; ship them with: primeruns replay --all --runs-dir %s",
            "; ".join(said),
            runs_dir,
        )


def _some(names: list[str]) -> str:
    """The first five of ``names``, and "..." for more."""
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def _taken_as(field: str, given: Any, taken: Any, fix: str) -> None:
    log.warning("prime-runs: init: %s=%s is taken as %r: %s", field, shown(given), taken, fix)


def _finish_timeout(given: Any) -> float:
    """``finish_timeout`` in seconds: a number, or what the vendor's SDK
    reads as one (``max(0, float(x))``: "30", -1); anything else (NaN, an
    infinity included) the default, with a warning."""
    return given_seconds("init", "finish_timeout", given, _DEFAULT_FINISH_TIMEOUT)


def _tags(given: Any) -> list[str] | None:
    """``tags`` as a list of strings: one string is one tag (the vendor's SDK
    made a tag of each of its characters), other items their text."""
    if given is None:
        return None
    fix = "pass a list of strings"
    if isinstance(given, str):
        _taken_as("tags", given, [given], fix)
        return [given]
    try:
        items = list(given)
    except Exception:  # not iterable, or an iteration of its own that raises: no tags
        _taken_as("tags", given, [], fix)
        return []
    if all(isinstance(t, str) for t in items):
        return items
    texts = [t if isinstance(t, str) else _text(t) for t in items]
    _taken_as("tags", given, texts, fix)
    return texts


def _text(item: Any) -> str:
    try:
        return str(item)
    except Exception:  # a __str__ that raises: the item's type names it
        return type(item).__name__
