"""Fuzz settings parsing: any ``~/.prime/config.json`` bytes and any PRIME_*
environment must resolve, or be refused with ConfigurationError, and the API
key must never show in the error text or in ``repr(settings)``.

Run (from the repository root, after ``pip install atheris``)::

    python fuzz/settings_parsing.py fuzz/corpus/settings_parsing -max_total_time=60 \\
        -artifact_prefix=/tmp/

(CI: ``-max_total_time=30``; on demand, longer.) The input is split into the
config file's bytes and the values of the environment variables the SDK
reads. ``python fuzz/settings_parsing.py --make-corpus DIR`` writes the seeds.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import atheris

# Instrumented: the package. Instrumenting every module the import pulls in
# (asyncio, ssl, pydantic, ...) took most of a bounded run's time, and the
# seed corpus reaches the same coverage without.
with atheris.instrument_imports(include=["primeruns"]):
    from primeruns.exceptions import ConfigurationError
    from primeruns.platform.settings import load_config_file, resolve_settings

ENV_VARS = (
    "PRIME_API_KEY",
    "PRIME_API_BASE_URL",
    "PRIME_BASE_URL",
    "PRIME_TEAM_ID",
    "PRIME_TRACES_URL",
    "PRIME_FRONTEND_URL",
    "PRIME_TRACES_OPT_OUT",
)
URL_PREFIXES = ["", "http://", "https://", "http://[", "http://h:", "ftp://", "http://h/api/"]
# A key long and odd enough that finding it in a message cannot be a coincidence.
SECRET = "pit_FUZZSECRET_7f3a9c"
_CONFIG = Path(tempfile.mkdtemp(prefix="fuzz-settings-")) / "config.json"


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    config_bytes = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096))
    environ: dict[str, str] = {}
    for name in ENV_VARS:
        if fdp.ConsumeBool():
            # URL variables get a plausible scheme first, so mutations reach the
            # host/port/path parsing instead of dying at "no scheme".
            prefix = fdp.PickValueInList(URL_PREFIXES) if name.endswith("_URL") else ""
            value = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 200))
            environ[name] = prefix + value
    key_source = fdp.ConsumeIntInRange(0, 2)
    if key_source == 1:
        environ["PRIME_API_KEY"] = SECRET
    _CONFIG.write_bytes(config_bytes)
    config = load_config_file(_CONFIG)  # never raises: junk degrades to {}
    assert isinstance(config, dict)
    if key_source == 2:
        config = {**config, "api_key": SECRET}
    try:
        settings = resolve_settings(environ=environ, config=config)
    except ConfigurationError as exc:
        assert SECRET not in str(exc), "the API key leaked into an error message"
        return
    assert SECRET not in repr(settings), "the API key leaked into repr(settings)"
    assert settings.api_root.startswith(("http://", "https://")) or "://" in settings.api_root


def make_corpus(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    configs = [
        {},
        {"api_key": "k", "base_url": "https://api.primeintellect.ai", "team_id": "t"},
        {"base_url": "http://127.0.0.1:8765/api/internal/rft", "traces_opt_out": "yes"},
        {"traces_url": "http://[::1]:9/api/v1", "frontend_url": 5, "team_id": 7},
    ]
    for index, cfg in enumerate(configs):
        body = json.dumps(cfg).encode()
        # Layout of test_one_input: a 2-byte length (ConsumeIntInRange), the bytes, then env.
        (out / f"config-{index}").write_bytes(
            len(body).to_bytes(2, "little") + body + os.urandom(64)
        )
    (out / "not-utf8").write_bytes(b"\x05\x00\xff\xfe{}\x00" + b"\x01" * 40)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--make-corpus":
        make_corpus(Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
