"""What the launcher (`python -m app`) checks and says before and while the server starts.

- `.env` in the working directory is loaded into the environment (what is already set wins), so provider
  keys and OTEL_* variables there count as well as PARLEY_* settings.
- A PARLEY_* variable that cannot be used is one line naming it (not its value) and exit 2.
- The models file: missing or malformed is one line and exit 2; an `api_key_env` whose variable is unset
  is a warning line (or, with PARLEY_MISSING_KEY=error, exit 2).
- Every model must be routable by LiteLLM, checked before the server binds: by LiteLLM's own files, read
  without importing it (llm.litellm_tables), and only for a name those cannot vouch for by LiteLLM
  itself, whose import takes seconds. A model it cannot route stops the launcher with one line per model
  and exit 2, before anything listens.
- One startup line: version, database (no credentials), auth mode, models file and default model, tools
  file, CORS origins, metrics and tracing.
"""

from __future__ import annotations

import logging
import os
import sys
from importlib import metadata
from pathlib import Path

from dotenv import load_dotenv
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from app.chat.auth import OPEN_MODE_HELP, ConfigError, load_key_ring
from app.llm.checks import missing_keys, model_problems, undecided
from app.llm.litellm_import import import_litellm
from app.llm.litellm_tables import Routes
from app.llm.models_file import ModelCatalog, ModelsFileError
from app.observability.setup import tracing_configured
from app.settings import Settings

log = logging.getLogger("parley")
ENV_FILE = ".env"


def load_env_file(path: str = ENV_FILE) -> bool:
    """Loads `path` into the environment without overriding what is set; whether it was there."""
    return load_dotenv(path, override=False) if Path(path).is_file() else False


def load_settings() -> Settings | None:
    """The settings; None (after one line per bad variable, naming it, never echoing its value: it may be
    a key) when a PARLEY_* variable cannot be used."""
    try:
        return Settings()
    except ValidationError as exc:
        for error in exc.errors(include_url=False, include_input=False):
            where = ".".join(str(part) for part in error["loc"])
            name = f"PARLEY_{where.upper()}" if where else "the settings"
            print(f"parley: {name}: {error['msg']}", file=sys.stderr)
        return None


def in_container() -> bool:
    """Docker leaves /.dockerenv, podman /run/.containerenv and the `container` variable."""
    return bool(os.environ.get("container")) or any(  # noqa: SIM112 (podman and systemd name it so)
        Path(marker).exists() for marker in ("/.dockerenv", "/run/.containerenv")
    )


def container_advice(refusal: str, host: str) -> str:
    """Inside a container, binding to 127.0.0.1 is no advice (nothing outside could reach it)."""
    if not in_container():
        return refusal
    return (
        f"Parley has no API keys and would serve everyone on {host}. Inside a container, {OPEN_MODE_HELP} "
        "(e.g. `docker run -e PARLEY_API_KEYS=alice:$KEY ...`, or `-e PARLEY_ALLOW_OPEN=1` with the port "
        "published on this machine only: `-p 127.0.0.1:8000:8000`)."
    )


def check_models_file(settings: Settings) -> ModelCatalog | None:
    """The models file's catalog; None (after one line) when it cannot be used, or when a key variable is
    unset and PARLEY_MISSING_KEY=error."""
    try:
        catalog = ModelCatalog.load(settings.models_file)
    except ModelsFileError as exc:
        first = str(exc).splitlines()
        detail = "; ".join(line.strip() for line in first[:3] if line.strip())
        print(f"parley: {detail} (PARLEY_MODELS_FILE)", file=sys.stderr)
        return None
    if not routable(catalog):
        return None
    problems = missing_keys(catalog)
    strict = settings.missing_key == "error"
    for problem in problems:
        kind = "error" if strict else "warning"
        print(
            f"parley: {kind}: {problem.message} (PARLEY_MISSING_KEY={settings.missing_key})", file=sys.stderr
        )
    return None if problems and strict else catalog


def routable(catalog: ModelCatalog) -> bool:
    """Whether LiteLLM routes every model of the file; else one line per model that it does not."""
    doubtful = undecided(catalog, Routes.read())
    if not doubtful:
        return True
    try:
        problems = model_problems(import_litellm(), catalog, doubtful)
    except Exception as exc:  # a check that cannot run must not stop a server that may work
        log.warning("could not check the models file with LiteLLM: %s", exc)
        return True
    for problem in problems:
        print(f"parley: models file: {problem.message}", file=sys.stderr)
    return not problems


def describe(settings: Settings, catalog: ModelCatalog, host: str, port: int) -> str:
    """The startup line: what runs, without a credential."""
    try:
        keys = load_key_ring(settings)
        kinds = [name for name, on in (("API keys", keys.entries), ("JWTs", keys.jwt)) if on]
        auth = " and ".join(kinds) if kinds else "open (no API keys)"
    except ConfigError:
        auth = "unusable keys"
    database = make_url(settings.database_url).render_as_string(hide_password=True)
    models = str(settings.models_file) if settings.models_file else "none"
    tools = getattr(settings, "tools_file", None) or "none (built-in tools)"
    origins = ", ".join(settings.cors_origins) or "none"
    return (
        f"Parley {_version()} on {host}:{port}: database {database}; auth {auth}; models file {models} "
        f"({len(catalog.names())} models), default model {settings.default_model}; tools file {tools}; "
        f"CORS origins {origins}; metrics {'on' if settings.metrics else 'off'}; "
        f"tracing {'on' if tracing_configured() else 'off'}; log format {settings.log_format}"
    )


def log_startup_line(settings: Settings, catalog: ModelCatalog, host: str, port: int) -> None:
    log.info("%s", describe(settings, catalog, host, port))


def _version() -> str:
    try:
        return metadata.version("parley")
    except metadata.PackageNotFoundError:
        return "0.1.0"
