"""The run's spec as one typed value: what ``init()`` was given, resolved,
and the platform the run was opened for.

``init()`` stores it twice, as the journal's ``spec`` meta value and as its
``RUN_OPEN`` entry, and every process that ships or reports the run reads it
back: the uplink, ``primeruns replay`` and ``sync``, ``ls`` and ``show``, the
dashboard. A journal outlives the SDK that wrote it, so the stored JSON object
keeps its keys and values from release to release (``RunSpec.to_json``), and a
journal may be damaged or hostile, so reading it back (``RunSpec.from_json``)
is where it is checked, once: a key that is missing or null takes its
default, and a value of the wrong type raises :class:`SpecError` naming the
field. No code past this module reads the spec as a dict.

Not :class:`primeruns.models.RunSpec`: that is the vendor's public name for
``init()``'s arguments, kept for compatibility and unused inside the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .exceptions import JournalCorruptError, JournalError
from .models import RUN_KIND, EnvironmentRef, Mode, RunKind

if TYPE_CHECKING:
    from .journal import Journal

__all__ = [
    "SPEC_KEY",
    "RunSpec",
    "SpecEnvironment",
    "SpecError",
    "journal_spec",
    "listed_spec",
    "spec_or_default",
    "stored_spec",
    "supply_spec",
]

#: The journal meta key the spec is stored under.
SPEC_KEY = "spec"

_KINDS: dict[str, RunKind] = {"eval": "eval", "train": "train"}
_MODES: dict[str, Mode] = {"online": "online", "offline": "offline", "disabled": "disabled"}


class SpecError(JournalError):
    """The journal's spec is not one the SDK writes: a value of the wrong
    type or shape, the field named (``spec.tags[2]``)."""


@dataclass(frozen=True)
class SpecEnvironment:
    """One environment as the spec holds it: a hub ``name``, an ``owner/name``
    ``slug`` or a resolved ``id`` (at least one), and an optional ``version_id``."""

    # In the order of EnvironmentRef's fields, which is the stored keys' order.
    name: str | None = None
    id: str | None = None
    version_id: str | None = None
    slug: str | None = None

    @classmethod
    def from_ref(cls, ref: EnvironmentRef) -> SpecEnvironment:
        return cls(name=ref.name, id=ref.id, version_id=ref.version_id, slug=ref.slug)

    def to_json(self) -> dict[str, str]:
        """The keys that are set (``init()`` has never stored a null one)."""
        stored = {f.name: getattr(self, f.name) for f in fields(self)}
        return {key: value for key, value in stored.items() if value is not None}

    @classmethod
    def from_json(cls, value: Any, where: str) -> SpecEnvironment:
        doc = _object(value, where)
        env = cls(**{f.name: _optional(doc, f.name, str, "a string", where) for f in fields(cls)})
        if not (env.name or env.slug or env.id):
            raise SpecError(f"{where} needs a name, a slug or an id")
        return env


@dataclass(frozen=True)
class RunSpec:
    """The spec of one run, as ``init()`` stored it in the journal.

    ``config`` (the user's) and ``training`` (the platform's registration
    fields) are JSON documents whose keys are not the SDK's to fix: they stay
    mappings, checked to be objects and passed on as they are.
    """

    kind: RunKind = RUN_KIND
    name: str | None = None
    environments: tuple[SpecEnvironment, ...] = ()
    dataset: str | None = None
    model: str | None = None
    framework: str | None = None
    description: str | None = None
    tags: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    team_id: str | None = None
    training: Mapping[str, Any] | None = None  # a training run's only
    attach_id: str | None = None
    frontend_url: str = ""
    base_url: str | None = None  # the API root the run was opened for
    traces_url: str | None = None
    traces_opt_out: bool = False
    mode: Mode | None = None
    run_key: str | None = None
    """The user's key of a run logged by several journals in turn (a job
    requeued offline): every journal with the key syncs into one platform run."""

    def to_json(self) -> dict[str, Any]:
        """The stored form: every key, in the order ``init()`` has always written
        them; ``run_key`` only when set (it came later)."""
        stored = {
            "kind": self.kind,
            "name": self.name,
            "environments": [env.to_json() for env in self.environments],
            "dataset": self.dataset,
            "model": self.model,
            "framework": self.framework,
            "description": self.description,
            "tags": list(self.tags),
            "config": dict(self.config),
            "team_id": self.team_id,
            "training": None if self.training is None else dict(self.training),
            "attach_id": self.attach_id,
            "frontend_url": self.frontend_url,
            "base_url": self.base_url,
            "traces_url": self.traces_url,
            "traces_opt_out": self.traces_opt_out,
            "mode": self.mode,
        }
        if self.run_key is not None:
            stored["run_key"] = self.run_key
        return stored

    @classmethod
    def from_json(cls, value: Any) -> RunSpec:
        """The spec a stored JSON value holds. Raises only :class:`SpecError`."""
        if type(value) is dict and _TEXT_KEYS.issuperset(value):
            plain = _plain_spec(value)
            if plain is not None:
                return cls(**plain)
        doc = _object(value, "spec")

        def text(key: str) -> str | None:
            value = doc.get(key)
            if value is None or isinstance(value, str):  # as stored: a listing reads thousands
                return value
            found: str | None = _optional(doc, key, str, "a string", "spec")  # raises
            return found

        def choice(key: str, choices: Mapping[str, Any]) -> Any:
            stored = doc.get(key)
            if stored is None:
                return None
            if not isinstance(stored, str) or stored not in choices:
                names = " or ".join(repr(c) for c in choices)
                raise SpecError(f"spec.{key} must be {names}, got {_shown(stored)}")
            return choices[stored]

        environments = _optional(doc, "environments", list, "a list", "spec") or []
        tags = _optional(doc, "tags", list, "a list", "spec") or []
        for i, tag in enumerate(tags):
            if not isinstance(tag, str):
                raise SpecError(f"spec.tags[{i}] must be a string, got {_shown(tag)}")
        config = _optional(doc, "config", Mapping, "an object", "spec")
        training = _optional(doc, "training", Mapping, "an object", "spec")
        opted_out = _optional(doc, "traces_opt_out", bool, "true or false", "spec")
        return cls(
            kind=choice("kind", _KINDS) or RUN_KIND,
            name=text("name"),
            environments=tuple(
                SpecEnvironment.from_json(env, f"spec.environments[{i}]")
                for i, env in enumerate(environments)
            ),
            dataset=text("dataset"),
            model=text("model"),
            framework=text("framework"),
            description=text("description"),
            tags=tuple(tags),
            config=dict(config or {}),
            team_id=text("team_id"),
            training=None if training is None else dict(training),
            attach_id=text("attach_id"),
            frontend_url=text("frontend_url") or "",
            base_url=text("base_url"),
            traces_url=text("traces_url"),
            traces_opt_out=bool(opted_out),
            mode=choice("mode", _MODES),
            run_key=text("run_key"),
        )


#: The keys of a stored spec whose values are text (or null), each read as
#: stored; ``kind`` and ``mode`` are text among choices.
_TEXT_KEYS = frozenset(
    {
        "kind",
        "name",
        "dataset",
        "model",
        "framework",
        "description",
        "team_id",
        "attach_id",
        "frontend_url",
        "base_url",
        "traces_url",
        "mode",
        "run_key",
    }
)


def _plain_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """``RunSpec``'s arguments for a stored spec of text keys alone
    (``_TEXT_KEYS``), as ``RunSpec.from_json`` reads them; None when any is
    not text or null, or ``kind`` or ``mode`` is not among its choices (read
    the long way, which names what is wrong). A listing reads the spec of
    every journal, each as its row keeps it (``summary_index``): of text
    keys alone, and the long way ~15 µs of it."""
    for stored in doc.values():
        if stored is not None and type(stored) is not str:
            return None
    kind, mode = doc.get("kind"), doc.get("mode")
    if (kind is not None and kind not in _KINDS) or (mode is not None and mode not in _MODES):
        return None
    found = dict(doc)
    found["kind"] = kind or RUN_KIND
    if not doc.get("frontend_url"):
        found["frontend_url"] = ""
    return found


def journal_spec(journal: Journal) -> RunSpec:
    """The spec ``journal`` holds, the defaults when it holds none (as a journal
    rebuilt after damage may not). Raises :class:`SpecError` for one of the
    wrong shape and ``JournalCorruptError`` for one that cannot be read."""
    stored = journal.get_meta(SPEC_KEY)
    return RunSpec() if stored is None else stored_spec(stored)


def stored_spec(value: Any) -> RunSpec:
    """The spec a journal stores: ``RunSpec.from_json``, and a
    :class:`SpecError` for an object that names no kind. ``init()`` has
    always stored the kind, so one without it is damage (``{}``), and read
    with the default kind a training run's records would ship to an
    evaluation's sinks."""
    spec = RunSpec.from_json(value)
    if value.get("kind") is None:  # (an object: from_json checked)
        raise SpecError("spec.kind is missing: the spec is damaged")
    return spec


def spec_or_default(journal: Journal, fallback: RunSpec | None = None) -> RunSpec:
    """``journal_spec``, with ``fallback`` (the user's, for a spec lost to
    damage) or the defaults for a spec of the wrong shape or none: for what
    only tunes how a journal is shipped (its registration, which needs the
    spec, fails and says why). A spec that cannot be read at all (not
    JSON) is the user's too where they gave one: ``sync --spec FILE`` is
    what ``ls``, ``show`` and ``sync --all`` tell them to run for it, and it
    stopped on "damaged journal" before storing theirs (``supply_spec``)."""
    try:
        if fallback is not None and journal.get_meta(SPEC_KEY) is None:
            return fallback
        return journal_spec(journal)
    except SpecError:
        return fallback or RunSpec()
    except JournalCorruptError:
        if fallback is None:
            raise
        return fallback


def supply_spec(journal: Journal, spec: RunSpec | None) -> bool:
    """Store ``spec`` as the spec of ``journal`` when its own cannot be read
    (lost, damaged, or naming no kind): the user's ``--spec``, or the spec of
    the process taking the journal over, bound to the same run. Whether it did."""
    if spec is None:
        return False
    try:
        stored = journal.get_meta(SPEC_KEY)
        if stored is not None:
            stored_spec(stored)
            return False
    except (SpecError, JournalError):
        pass
    journal.set_meta(SPEC_KEY, spec.to_json())
    return True


def listed_spec(meta: Mapping[str, Any]) -> RunSpec | None:
    """The spec in a listed journal's meta values; None when there is none or
    it is damaged (a report shows what else the journal holds all the same)."""
    stored = meta.get(SPEC_KEY)
    if stored is None:
        return None
    try:
        return stored_spec(stored)
    except SpecError:
        return None


def _object(value: Any, where: str) -> Mapping[str, Any]:
    # A dict is checked first: an ABC's isinstance costs ~10 µs, and a
    # listing reads the spec of every journal.
    if type(value) is not dict and not isinstance(value, Mapping):
        raise SpecError(f"{where} must be an object, got {_shown(value)}")
    return value


def _optional(doc: Mapping[str, Any], key: str, kind: type, what: str, where: str) -> Any:
    """``doc[key]`` if it is a ``kind``; None when it is missing or null."""
    value = doc.get(key)
    if value is None or type(value) is kind or (kind is Mapping and type(value) is dict):
        return value  # (as stored: the plain types first, as ``_object``)
    if isinstance(value, kind):
        return value
    raise SpecError(f"{where}.{key} must be {what}, got {_shown(value)}")


def _shown(value: Any) -> str:
    """A stored value in an error message: its JSON type, and it, cut short."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names.update({list: "a list", dict: "an object", type(None): "null"})
    return f"{names.get(type(value), type(value).__name__)} ({value!r:.60})"
