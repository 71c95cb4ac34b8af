"""The distribution's shape: every package is listed, the public names are the
vendor's, and ``import prime_runs`` is this very package."""

from __future__ import annotations
import __future__

import tomllib
import types
from pathlib import Path

import pytest

import primeruns

ROOT = Path(__file__).resolve().parents[1]

# The names code written for the vendor's prime-runs 0.1.4 imports.
VENDOR_NAMES = {
    "init", "Run", "RunStatus", "RunKind", "TrainingSpec", "ConfigSource", "CONFIG_SOURCE_KEY",
    "EnvironmentRef", "TRACES_OPT_OUT_ENV", "MODE_ENV", "metrics", "projection",
    "PrimeRunsError", "ConfigurationError", "EnvironmentResolutionError", "APIError",
    "RunFinishedError", "ForbiddenError", "NotFoundError", "PaymentRequiredError",
    "RetryableAPIError", "TransportError", "UnauthorizedError",
}  # fmt: skip


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "primeruns").rglob("__init__.py")
        if "_compat" not in p.parts
    }
    assert found | {"prime_runs"} == listed


def test_public_names_cover_the_vendor_api() -> None:
    assert set(primeruns.__all__) >= VENDOR_NAMES
    for name in primeruns.__all__:
        assert hasattr(primeruns, name), name


def test_all_is_exactly_the_public_names() -> None:
    """What ``from primeruns import *`` gives is what the package means to
    export: no public name left out of ``__all__``, none listed that is not
    there. Submodules are exports only where listed (``metrics``,
    ``projection``); the others are on the package because they were loaded.
    The names are loaded on first use: every one is, first."""
    for name in primeruns.__all__:
        getattr(primeruns, name)
    assert set(dir(primeruns)) >= set(primeruns.__all__)
    public = {
        name
        for name, value in vars(primeruns).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType | __future__._Feature)
    }
    modules = {"metrics", "projection"}
    assert set(primeruns.__all__) == public | modules
    assert len(primeruns.__all__) == len(set(primeruns.__all__))


def test_the_local_platforms_name_is_listed_before_it_is_imported() -> None:
    """``primeruns.local`` imports ``LocalPlatform`` when first asked for (the
    dashboard and ``serve`` never use it); ``dir`` lists it all the same, as
    it did when it was imported with the package, and as the package's own
    names are (a REPL completes from ``dir``)."""
    import primeruns.local

    assert "LocalPlatform" in dir(primeruns.local)
    assert set(dir(primeruns.local)) >= set(primeruns.local.__all__)


def test_platform_errors_are_prime_traces_own_classes() -> None:
    """``except`` clauses written for the vendor's SDK and for prime-traces
    catch the platform's errors here; the journal's stay this SDK's own."""
    import prime_traces

    for name in ("APIError", "ForbiddenError", "NotFoundError", "UnauthorizedError",
                 "PaymentRequiredError", "RetryableAPIError", "TransportError",
                 "TraceTooLargeError", "ValidationRejectedError", "LineFormatConflictError",
                 "APITimeoutError"):  # fmt: skip
        assert getattr(primeruns, name) is getattr(prime_traces.exceptions, name), name
    assert not issubclass(primeruns.APIError, primeruns.PrimeRunsError)
    assert issubclass(primeruns.JournalLockedError, primeruns.PrimeRunsError)
    assert not issubclass(primeruns.JournalError, prime_traces.PrimeTracesError)


def test_the_package_is_typed() -> None:
    assert (ROOT / "primeruns" / "py.typed").is_file()


def test_the_vendor_import_name_gives_the_same_objects() -> None:
    import prime_runs
    import prime_runs.exceptions
    import prime_runs.projection

    assert prime_runs is primeruns
    assert prime_runs.projection is primeruns.projection
    assert prime_runs.exceptions.APIError is primeruns.APIError
    assert primeruns.projection.__spec__ is not None
    assert primeruns.projection.__spec__.name == "primeruns.projection"


def test_the_exception_tree_in_the_docstring_names_every_class() -> None:
    """The tree at the top of ``exceptions.py`` is the reference users read:
    every exception class the module exports is in it, under its real base."""
    from primeruns import exceptions

    tree: dict[str, str] = {}  # class name -> the name of its parent in the tree
    stack: list[tuple[int, str]] = []
    for line in (exceptions.__doc__ or "").splitlines():
        text = line.split("── ")[-1] if "── " in line else line.strip()
        if not text or not (line.strip() == "Exception" or "── " in line):
            continue
        name = text.split()[0].split(".")[-1]
        depth = line.index(text)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            tree[name] = stack[-1][1]
        stack.append((depth, name))
    classes = [getattr(exceptions, n) for n in exceptions.__all__]
    for cls in (c for c in classes if isinstance(c, type)):
        assert cls.__name__ in tree, f"{cls.__name__} is not in the tree"
        assert tree[cls.__name__] == cls.__mro__[1].__name__, cls


def test_the_readme_settings_table_lists_every_setting_the_code_reads() -> None:
    """A setting a user cannot find is one they cannot use: every environment
    variable the package reads is in the README's Settings section."""
    import re

    names = {
        name
        for path in (ROOT / "primeruns").rglob("*.py")
        for name in re.findall(r"\"(PRIME(?:RUNS)?_[A-Z_]+)\"", path.read_text())
    }
    readme = (ROOT / "README.rst").read_text()
    settings = readme.split("\nSettings\n--------\n", 1)[1].split("\nThe command line\n", 1)[0]
    assert names and not {n for n in names if n not in settings}


# Run in a child whose imports of every installed distribution outside the
# core dependencies fail, as they would after a bare `pip install prime-runs`.
_BARE_CHILD = """
import importlib.abc, json, sys
blocked = set(json.loads(sys.argv[1]))

class Bare(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Bare())
import primeruns
from primeruns.cli import main
sys.exit(main(["ls", "--runs-dir", sys.argv[2]]))
"""


def _requirement_closure(root: str) -> set[str]:
    """``root`` and every distribution its unconditional requirements pull in."""
    import importlib.metadata as md
    import re

    seen: set[str] = set()
    todo = [root]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue  # an extra's, not a core requirement
            todo.append(re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0])
    return seen


def test_import_primeruns_and_its_cli_need_only_the_core_dependencies(tmp_path: Path) -> None:
    import importlib.metadata as md
    import json
    import re
    import subprocess
    import sys

    core = _requirement_closure("prime-runs")
    blocked = sorted(
        top
        for top, dists in md.packages_distributions().items()
        if not any(re.sub(r"[-_.]+", "-", d).lower() in core for d in dists)
        and not top.startswith("_")
    )
    assert "uvicorn" in blocked and "pyarrow" in blocked  # extras, not core
    child = subprocess.run(
        [sys.executable, "-c", _BARE_CHILD, json.dumps(blocked), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert "no runs under" in child.stdout


_COMMAND_IMPORTS = """
import json, sys
from primeruns.cli import main
code = main(sys.argv[2:] + ["--runs-dir", sys.argv[1]])
print(json.dumps([code, sorted(sys.modules)]))
"""


def _one_finished_journal(runs: Path) -> None:
    from primeruns.journal import EntryKind, Journal

    with Journal.create(runs, local_id="a", meta={"spec": {"kind": "eval", "mode": "online"}}) as j:
        j.append(EntryKind.FINISH, [b'{"status": "completed"}'])


def _modules_loaded_by(runs: Path, command: list[str]) -> set[str]:
    """The modules ``primeruns COMMAND --runs-dir RUNS`` loaded, in a fresh process."""
    import json
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", _COMMAND_IMPORTS, str(runs), *command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    code, loaded = json.loads(child.stdout.strip().splitlines()[-1])
    assert code == 0, child.stderr[-2000:]
    return set(loaded)


@pytest.mark.parametrize("command", [["ls"], ["ls", "--json"], ["gc", "--dry-run"]])
def test_a_command_that_reads_journals_loads_no_http_client(
    tmp_path: Path, command: list[str]
) -> None:
    """``primeruns ls`` imported the whole SDK (its uplink, the platform's
    client, prime_traces and httpx: ~0.5 s of every listing) to list
    journals. ``import primeruns`` loads its public names on first use, and
    a command only its own module; the listing reads no platform class."""
    runs = tmp_path / "runs"
    _one_finished_journal(runs)
    loaded = {name.split(".")[0] for name in _modules_loaded_by(runs, command)}
    assert not {"httpx", "prime_traces", "pyarrow"} & loaded


@pytest.mark.parametrize("command", [["ls"], ["ls", "--json"]])
def test_ls_of_journals_listed_before_loads_no_journal_writing_code(
    tmp_path: Path, command: list[str]
) -> None:
    """``primeruns ls`` loaded the journal's writing side (``journal.journal``
    and its appends, capacity and mover: half of its start-up) and rich's
    table, where journals whose summaries are current are never opened and
    the lines are laid out without a ``Table``: both load only when needed."""
    runs = tmp_path / "runs"
    _one_finished_journal(runs)
    _modules_loaded_by(runs, command)  # reads the journal and keeps its summary
    loaded = _modules_loaded_by(runs, command)
    assert not {"primeruns.journal.journal", "primeruns.journal.appending", "rich.table"} & loaded


def test_ls_json_loads_no_terminal_renderer(tmp_path: Path) -> None:
    """``primeruns ls --json`` loaded rich's console, text and styles (~30 ms
    of a listing's start-up, which issue #32 holds under 1 s with 3,000
    past runs) to print a JSON document: only a table drawn loads them."""
    runs = tmp_path / "runs"
    _one_finished_journal(runs)
    loaded = _modules_loaded_by(runs, ["ls", "--json"])
    assert not {"rich.console", "rich.text", "rich.segment", "rich.style"} & loaded
    assert "rich.console" in _modules_loaded_by(runs, ["ls"])  # a table is drawn with it


@pytest.mark.parametrize("command", [["ls"], ["ls", "--json"]])
def test_ls_of_journals_listed_before_starts_no_openssl_nor_subprocess(
    tmp_path: Path, command: list[str]
) -> None:
    """``primeruns ls`` loaded OpenSSL's hashes (for a run's lock name and
    its index folder, neither of which a listing makes) and subprocess (for
    the probe child, which a journal whose summary is current never needs):
    ~15 ms of every listing's start-up. Nor ISA-L (the journal's checksums,
    ``journal.checksum``: 2-5 ms), where no checksum is computed."""
    runs = tmp_path / "runs"
    _one_finished_journal(runs)
    _modules_loaded_by(runs, command)  # reads the journal and keeps its summary
    loaded = _modules_loaded_by(runs, command)
    assert not {"_hashlib", "subprocess", "isal.isal_zlib"} & loaded


# Without site's start-up (``-S``): an editable install's ``.pth`` finder
# loads importlib.abc, tempfile and more before any import of ours, where an
# installed wheel loads none of them. Paths of the package and its
# dependencies are given instead, in the order the test's own process has.
_LEAN_CHILD = """
import os, sys
sys.path[:0] = sys.argv[1].split(os.pathsep)
import primeruns
import primeruns._compat  # the package ``import prime_runs`` runs
from primeruns.cli import main
code = main(sys.argv[3:] + ["--runs-dir", sys.argv[2]])
print(code, *sorted(sys.modules))
"""


def _modules_loaded_without_site(runs: Path, command: list[str]) -> set[str]:
    """The modules that ``import primeruns``, ``import prime_runs`` and then
    ``primeruns COMMAND --runs-dir RUNS`` loaded, in a fresh process whose
    start-up loaded only what the interpreter needs."""
    import os
    import subprocess
    import sys

    paths = [str(ROOT), *(p for p in sys.path if p.endswith("-packages"))]
    child = subprocess.run(
        [sys.executable, "-S", "-c", _LEAN_CHILD, os.pathsep.join(paths), str(runs), *command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    code, *loaded = child.stdout.strip().splitlines()[-1].split()
    assert code == "0", child.stderr[-2000:]
    return set(loaded)


@pytest.mark.parametrize("command", [["ls"], ["ls", "--json"]])
def test_the_import_and_ls_of_journals_listed_before_load_no_unused_module(
    tmp_path: Path, command: list[str]
) -> None:
    """``import primeruns`` (or ``prime_runs``) and ``primeruns ls`` loaded
    ``importlib.abc`` for two import-hook base classes (and with it
    ``importlib.resources`` and tempfile: ~20 ms), and tempfile for the
    summaries a listing whose summaries are current never writes: none of
    them a listing of past runs uses."""
    runs = tmp_path / "runs"
    _one_finished_journal(runs)
    _modules_loaded_without_site(runs, command)  # reads the journal and keeps its summary
    loaded = _modules_loaded_without_site(runs, command)
    assert "primeruns.journal.listing" in loaded  # the listing ran in this child
    assert not {"importlib.abc", "importlib.resources", "tempfile"} & loaded


def test_the_package_loads_its_public_names_on_first_use() -> None:
    """``import primeruns`` is cheap; ``pr.init`` and the rest are the same
    objects whichever way they are reached."""
    import subprocess
    import sys

    script = (
        "import sys, primeruns as pr; assert 'httpx' not in sys.modules; "
        "from primeruns import init; from primeruns.opening import init as real; "
        "assert init is pr.init is real; import prime_runs; assert prime_runs.Run is pr.Run; "
        "print(sorted(set(pr.__all__) - set(dir(pr))))"
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == "[]"


def test_the_sdks_fork_handlers_run_before_a_users_registered_after_import(
    tmp_path: Path,
) -> None:
    """A forked child's journals are marked inherited (never reopened or
    closed by the child) before any handler the user registered after
    ``import primeruns`` runs, as when the package loaded every module at
    import: a user's handler that logs in the child finds them marked."""
    import subprocess
    import sys

    script = f"""
import os, primeruns as pr
seen = []
def users_handler():
    from primeruns.journal import store
    seen.append(all(s.forked for s in list(store._LIVE)) and bool(store._LIVE))
os.register_at_fork(after_in_child=users_handler)
runs = {str(tmp_path / "runs")!r}
run = pr.init(mode="offline", kind="train", model="m", team_id="t", runs_dir=runs)
run.log_metrics({{"loss": 1.0}}, step=0)
pid = os.fork()
if pid == 0:
    os._exit(0 if seen == [True] else 3)
_, status = os.waitpid(pid, 0)
run.finish()
print(os.waitstatus_to_exitcode(status))
"""
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip().splitlines()[-1] == "0", "the user's handler ran first"


_TRACES_ORDER = """
import importlib, json, sys
import primeruns as pr
from primeruns.exceptions import is_transient
first = sys.argv[1]
if first == "package":
    import prime_traces
with pr.init(
    name="x", model="m", environments=["gsm8k"], mode="offline", runs_dir=sys.argv[2]
) as run:
    run.log_episodes([{"id": "e1", "traces": []}])
    assert run.dropped_records == 0
loaded_by_run = "prime_traces" in sys.modules
error = pr.RetryableAPIError("busy", status_code=503)
transient = is_transient(error)
import prime_traces
import prime_traces.exceptions
from prime_traces.exceptions import APIError as named
module = sys.modules["prime_traces.exceptions"]
print(json.dumps({
    "loaded_by_run": loaded_by_run,
    "transient": transient,
    "bound": prime_traces.exceptions is module,
    "same": [getattr(pr, n) is getattr(prime_traces, n) is getattr(module, n)
             for n in ("APIError", "RetryableAPIError", "TransportError", "ForbiddenError")],
    "named": named is pr.APIError,
    "unproven": issubclass(pr.exceptions.UnprovenAnswerError, prime_traces.RetryableAPIError),
    "loader": type(prime_traces.__spec__.loader).__module__,
    "finders": [type(f).__module__ for f in sys.meta_path if "primeruns" in type(f).__module__],
}))
"""


@pytest.mark.parametrize("first", ["sdk", "package"])
def test_a_run_loads_prime_traces_exception_classes_not_its_clients(
    tmp_path: Path, first: str
) -> None:
    """prime_traces' package loads its HTTP clients and pydantic models:
    0.1-0.3 s of every ``init()`` and uplink start, for a dozen exception
    classes. A run loads only its ``exceptions`` module; whichever is imported
    first, the SDK's classes are prime_traces' own, reached by every path
    (``prime_traces.X``, ``prime_traces.exceptions.X``, ``from ... import``)."""
    import json
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", _TRACES_ORDER, first, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert out["loaded_by_run"] is (first == "package")
    assert out["transient"] is True
    assert out["bound"] is True
    assert out["same"] == [True] * 4
    assert out["named"] is True
    assert out["unproven"] is True
    assert "primeruns" not in out["loader"]  # the package keeps its own loader
    assert out["finders"] == []  # nothing of ours is left in the import system


def _run_script(script: str, *args: str) -> dict[str, object]:
    """``script`` in a fresh interpreter (nothing of prime_traces loaded yet);
    the JSON object its last line prints."""
    import json
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    out: dict[str, object] = json.loads(child.stdout.strip().splitlines()[-1])
    return out


_LOOKED_FOR_FIRST = """
import importlib.util, json, sys
import primeruns as pr
with pr.init(
    name="x", model="m", environments=["gsm8k"], mode="offline", runs_dir=sys.argv[1]
) as run:
    run.log_episodes([{"id": "e1", "traces": []}])
# An optional dependency looked for before it is imported, as libraries do.
available = importlib.util.find_spec("prime_traces") is not None
import prime_traces
import prime_traces.exceptions
print(json.dumps({
    "available": available,
    "bound": getattr(prime_traces, "exceptions", None) is sys.modules["prime_traces.exceptions"],
}))
"""


def test_prime_traces_looked_for_before_it_is_imported_still_has_its_exceptions(
    tmp_path: Path,
) -> None:
    """``importlib.util.find_spec("prime_traces")`` (a library checking for an
    optional dependency) asks the import system's finders without loading the
    package. After a run loaded prime_traces' exception classes alone, the
    package imported later must still hold them as ``prime_traces.exceptions``:
    ``except prime_traces.exceptions.APIError`` and ``mock.patch`` reach
    them so."""
    out = _run_script(_LOOKED_FOR_FIRST, str(tmp_path / "runs"))
    assert out == {"available": True, "bound": True}


_IMPORTED_MEANWHILE = """
import importlib.abc, json, sys, threading
from primeruns import traces_exceptions

HOLD_AT = {
    # inside prime_traces/__init__, before its ``from .exceptions import ...``
    "package": "prime_traces.async_traces",
    # inside that import: past its look for the module in sys.modules
    "exceptions": "prime_traces.exceptions",
}[sys.argv[1]]
main = threading.current_thread()
paused, go = threading.Event(), threading.Event()


class Pause(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == HOLD_AT and threading.current_thread() is not main:
            paused.set()
            go.wait()
        return None


sys.meta_path.insert(0, Pause())
alone = traces_exceptions._load_alone


def another_thread_imports_the_package_meanwhile():
    # load() found no prime_traces loaded; another thread imports it now.
    importer = threading.Thread(target=lambda: __import__("prime_traces"))
    importer.start()
    paused.wait()
    module = alone()
    # That thread goes on only once this one waits for something (no thread
    # switch by the clock): load() first does all it does without waiting.
    sys.setswitchinterval(1e6)
    go.set()
    return module


traces_exceptions._load_alone = another_thread_imports_the_package_meanwhile
module = traces_exceptions.load()
sys.setswitchinterval(0.005)
for thread in threading.enumerate():
    if thread is not main:
        thread.join()
import prime_traces
try:
    raise module.APIError("refused", status_code=403)
except prime_traces.APIError:
    caught = True
except Exception:
    caught = False
print(json.dumps({
    "one_module": sys.modules["prime_traces.exceptions"] is module,
    "bound": getattr(prime_traces, "exceptions", None) is module,
    "caught": caught,
    "finders": [type(f).__name__ for f in sys.meta_path
                if type(f).__module__ == traces_exceptions.__name__],
}))
"""


@pytest.mark.parametrize("held", ["package", "exceptions"])
def test_prime_traces_imported_by_another_thread_during_the_first_load_has_its_exceptions(
    held: str,
) -> None:
    """A thread importing prime_traces while a run loads its exception classes
    (``pr.init()`` beside a thread that imports a library using prime_traces).
    Whether that import is yet to look for ``prime_traces.exceptions``
    (``package``: it then finds the classes' module already there) or already
    past that look (``exceptions``: it then loads the file itself), there is
    one set of classes: what the SDK raises, ``except prime_traces.APIError``
    catches; the package holds them as ``prime_traces.exceptions``; nothing of
    ours is left in the import system."""
    out = _run_script(_IMPORTED_MEANWHILE, held)
    assert out == {"one_module": True, "bound": True, "caught": True, "finders": []}
