"""The docs (README.md and docs/*.md) follow the code and run.

Their reference tables follow the code: every route with its query parameters (docs/api.md), every event
with every field (docs/events.md), every setting with its environment variable and default
(docs/configuration.md). A route, a field or a setting added without its row fails here. Every `sh` block
is marked: `<!-- docs-test: run -->` blocks run, in order, one bash script per page with
`set -euo pipefail`, twice in a row against one live server (so a snippet that only works once fails);
`<!-- docs-test: skip: why -->` blocks (a server start, an endless stream) say why they cannot. A snippet
that fails, or prints `null` where it promised a value, fails here. And every relative link resolves, to a
file and, where it names one, to a heading of it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, NamedTuple, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from app.llm.models_file import ModelsFile
from app.main import create_app
from app.protocol.events import Event
from app.settings import Settings
from app.tools.config import ToolsConfigError, parse_tools_config
from tests.support.server import live_server

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
API_PAGE = ROOT / "docs" / "api.md"
EVENTS_PAGE = ROOT / "docs" / "events.md"
CONFIGURATION_PAGE = ROOT / "docs" / "configuration.md"
COMMON = ("type", "seq", "session_id")  # every event has them: the section says so once


def _section(page: Path, heading: str) -> str:
    text = page.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _rows(section: str, header: str) -> dict[str, list[str]]:
    """The table under `header` (its first line): first cell, unquoted, to the other cells."""
    lines = section[section.index(header) :].splitlines()
    rows: dict[str, list[str]] = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        first, *cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[first.strip("`")] = cells
    return rows


def _names(text: str) -> set[str]:
    """Every identifier quoted in the text: `a`, `b: {c, d}` give a, b, c and d."""
    return {name for quoted in re.findall(r"`([^`]*)`", text) for name in re.findall(r"\w+", quoted)}


def _event_models() -> list[type[BaseModel]]:
    return list(get_args(get_args(Event)[0]))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (list, Union, types.UnionType):
        return [model for arg in get_args(annotation) for model in _models_in(arg)]
    return []


def _fields(model: type[BaseModel], skip: tuple[str, ...] = ()) -> set[str]:
    """The model's fields and, recursively, those of the models inside them."""
    names: set[str] = set()
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        names.add(name)
        for inner in _models_in(field.annotation):
            names |= _fields(inner)
    return names


def test_the_event_table_lists_every_event_with_every_field() -> None:
    section = _section(EVENTS_PAGE, "The events")
    rows = _rows(section, "| type | fields |")
    models = {model.model_fields["type"].default: model for model in _event_models()}
    assert sorted(rows) == sorted(models), "one row per event type, and no other"
    for type_, model in models.items():
        missing = _fields(model, skip=COMMON) - _names(rows[type_][0])
        assert not missing, f"docs/events.md table, {type_}: {sorted(missing)} missing"
    assert all(f"`{name}`" in section for name in COMMON)


def _documented_default(value: Any) -> str:
    if value is None or value in ("", []):
        return "none"
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    return f"`{value}`"


def _same(cell: str, expected: str) -> bool:
    if cell == expected:
        return True
    try:  # `30` documents 30.0, `1.0` documents 1.0
        return float(cell.strip("`")) == float(expected.strip("`"))
    except ValueError:
        return False


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_the_configuration_table_lists_every_setting_with_its_default(name: str) -> None:
    rows = _rows(_section(CONFIGURATION_PAGE, "Settings"), "| variable | default | meaning |")
    variable = f"PARLEY_{name.upper()}"
    assert variable in rows, f"docs/configuration.md table: no row for {variable}"
    field = Settings.model_fields[name]
    default = field.get_default(call_default_factory=True)
    assert default is not PydanticUndefined
    cell, meaning = rows[variable]
    assert _same(cell, _documented_default(default)), (
        f"{variable}: docs/configuration.md says {cell}, the code {default!r}"
    )
    assert meaning, f"{variable} has no meaning in docs/configuration.md"


# Not settings of the app: `make run`'s (and its recipe's `python -m app --host/--port`) address.
MAKE_VARIABLES = {"HOST": "`127.0.0.1`", "PORT": "`8000`"}


def test_the_configuration_table_has_no_setting_the_code_does_not_know() -> None:
    rows = _rows(_section(CONFIGURATION_PAGE, "Settings"), "| variable | default | meaning |")
    known = {f"PARLEY_{name.upper()}" for name in Settings.model_fields} | set(MAKE_VARIABLES)
    assert set(rows) <= known, sorted(set(rows) - known)


def test_host_and_port_are_in_the_table_with_the_makefiles_defaults() -> None:
    rows = _rows(_section(CONFIGURATION_PAGE, "Settings"), "| variable | default | meaning |")
    makefile = (ROOT / "Makefile").read_text()
    for name, default in MAKE_VARIABLES.items():
        assert rows[name][0] == default
        assert f"{name} ?= {default.strip('`')}" in makefile


def _documented_routes() -> dict[tuple[str, str], set[str]]:
    """The API table's routes: (method, path) to the query parameters its `?a=&b=` names. A path given as
    `.../rest` goes on from the previous path of its row, at rest's first segment."""
    section = _section(API_PAGE, "Routes")
    lines = section[section.index("| method and path |") :].splitlines()[2:]
    routes: dict[tuple[str, str], set[str]] = {}
    for line in lines:
        if not line.startswith("|"):
            break
        previous = ""
        for quoted in re.findall(r"`([^`]*)`", line.strip("|").split("|")[0]):
            found = re.fullmatch(r"(GET|POST|PUT|PATCH|DELETE) ([^?\s]+)(?:\?(\S*))?", quoted)
            if found is None:
                continue  # a request body
            method, path, query = found.groups()
            if path.startswith("..."):
                rest = path[len("...") :]
                path = previous[: previous.index("/" + rest.split("/")[1])] + rest
            # A name may stand for several (`metadata.{key}=`, the list's metadata filter).
            routes[(method, path)] = {name for name in re.findall(r"([\w.{}]+)=", query or "")}
            previous = path
    return routes


def test_the_api_table_lists_every_route_with_its_query_parameters() -> None:
    spec = create_app(Settings()).openapi()
    routes = {
        (method.upper(), path): {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
    }
    documented = _documented_routes()
    assert sorted(documented) == sorted(routes), "docs/api.md: one route per operation"
    for route, query in routes.items():
        assert documented[route] == query, (
            f"docs/api.md routes table, {' '.join(route)}: the code takes {sorted(query)}"
        )


FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
MARK = re.compile(r"<!-- docs-test: (run(?: with (?:\w+=\S+ ?)+)?|skip: \S[^>]*|file \S+|background) -->")
DOCS_URL = "http://127.0.0.1:8000"


def _marked_blocks(page: Path) -> list[tuple[str, str, str, str]]:
    """Every fenced block of the page: (where, its language, its mark, its code). The mark is the text of the
    `<!-- docs-test: ... -->` on the line before the block (`run`, `run with K=V ...`, `skip: why`,
    `file NAME`, `background`), or empty."""
    text = page.read_text()
    blocks = []
    for fence in FENCE.finditer(text):
        mark = MARK.fullmatch(text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1])
        where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, fence.start()) + 1}"
        blocks.append((where, fence.group(1), mark.group(1) if mark else "", fence.group(2)))
    return blocks


def _shell_blocks(page: Path) -> list[tuple[str, str, str]]:
    return [
        (f"{where} ({language})", mark, code)
        for where, language, mark, code in _marked_blocks(page)
        if language in ("sh", "bash", "shell", "console")
    ]


def test_every_shell_block_is_run_or_says_why_not() -> None:
    blocks = [block for page in DOCS for block in _shell_blocks(page)]
    unmarked = [where for where, mark, _ in blocks if not mark or not where.endswith("(sh)")]
    assert not unmarked, f"sh blocks need a docs-test mark (run, or skip: why): {unmarked}"
    assert sum(mark.startswith("run") for _, mark, _ in blocks) >= 12
    assert sum(mark == "run" for _, mark, _ in _shell_blocks(README)) >= 4


class Script(NamedTuple):
    """The `run` blocks of one page that share a server: the page's plain `run` blocks, or those marked
    `run with` the same variables (PARLEY_ ones configure the server, all are in the script's environment).
    The page's `file` blocks are written to the script's directory first, and for a `run with` script its
    `background` blocks (a server the reader leaves running in a terminal of its own) are started there."""

    page: Path
    env: tuple[tuple[str, str], ...]
    code: str

    @property
    def id(self) -> str:
        return self.page.name + "".join(f"[{name}]" for name, _ in self.env if name.startswith("PARLEY_"))


def _scripts() -> list[Script]:
    scripts: dict[tuple[Path, tuple[tuple[str, str], ...]], list[str]] = {}
    for page in DOCS:
        for _, mark, code in _shell_blocks(page):
            if mark.startswith("run"):
                pairs = mark.removeprefix("run").removeprefix(" with").split()
                env = tuple((name, value) for name, _, value in (pair.partition("=") for pair in pairs))
                scripts.setdefault((page, env), []).append(code)
    return [Script(page, env, "\n".join(codes)) for (page, env), codes in scripts.items()]


def _background(page: Path) -> list[str]:
    return [code for _, mark, code in _shell_blocks(page) if mark == "background"]


def _files(page: Path) -> dict[str, str]:
    return {
        mark.removeprefix("file "): code
        for _, _, mark, code in _marked_blocks(page)
        if mark.startswith("file ")
    }


# The snippets run with the project's virtualenv first on PATH: httpie (`http`) is in the dev lock.
SNIPPET_PATH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _without_httpie(script: str) -> str:
    """httpie comes with the dev lock; where it is missing anyway its lines are left out (and under
    CI=true that is a failure)."""
    if shutil.which("http", path=SNIPPET_PATH) is not None:
        return script
    if os.environ.get("CI") == "true":
        pytest.fail("httpie (`http`) is not installed: the docs' httpie lines cannot be run")
    return "\n".join(
        ": httpie not installed" if line.startswith("http ") else line for line in script.splitlines()
    )


SCRIPTS = _scripts()


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize("script", SCRIPTS, ids=[script.id for script in SCRIPTS])
def test_the_scripted_snippets_run_twice_against_a_live_server(
    script: Script, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How it proves it: `set -euo pipefail` stops at the first command that fails (curl -f on an HTTP
    error, jq -e on a null), and the outputs the snippets print are checked; the second run, on the same
    database, proves that pasting them again works (fresh idempotency keys, nothing left waiting)."""
    missing = [tool for tool in ("bash", "curl", "jq") if shutil.which(tool) is None]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the docs snippets need {missing}")
        pytest.skip(f"the docs snippets need {missing}")
    for name, content in _files(script.page).items():
        (tmp_path / name).write_text(content)
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # what a file names as .venv/bin/python
    monkeypatch.chdir(tmp_path)  # the server reads the files (and starts stdio MCP servers) from there
    env = dict(script.env)
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # ${VAR} in a tools file comes from the server's environment
    overrides: dict[str, Any] = {
        name.removeprefix("PARLEY_").lower(): value
        for name, value in env.items()
        if name.startswith("PARLEY_")
    }
    settings = Settings(database_url=database_url, **overrides)  # the demo model at its documented pace
    code = _without_httpie(script.code)
    outputs = []
    with contextlib.ExitStack() as stack:
        for code_in_background in _background(script.page) if script.env else []:
            started = subprocess.Popen(
                ["bash", "-c", code_in_background], cwd=tmp_path, start_new_session=True, env=dict(os.environ)
            )
            stack.callback(_end, started)
        server = stack.enter_context(live_server(settings))
        for _ in range(2):
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", code.replace(DOCS_URL, server.base_url)],
                capture_output=True,
                text=True,
                timeout=180,
                cwd=tmp_path,
                env={**os.environ, **env, "PATH": SNIPPET_PATH},
            )
            assert done.returncode == 0, f"{done.stderr}\n--- stdout:\n{done.stdout}"
            assert "null" not in done.stdout.split(), done.stdout
            outputs.append(done.stdout)
    if script.page == README:
        for stdout in outputs:
            assert '"status": "cancelled"' in stdout and '"interrupted": true' in stdout, stdout
            assert '"queued":true' in stdout, stdout


def _end(process: subprocess.Popen[bytes]) -> None:
    """Ends a background block and everything it started (its process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=10)


def _blocks_of(language: str) -> list[tuple[str, str]]:
    return [
        (where, code)
        for page in DOCS
        for where, block_language, _, code in _marked_blocks(page)
        if block_language == language
    ]


def test_every_tools_file_and_models_file_in_the_docs_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The yaml and json blocks a reader copies into PARLEY_TOOLS_FILE or PARLEY_MODELS_FILE load as the
    server loads them (a ${VAR} gets a stand-in value)."""
    tools_files = [
        (where, code)
        for where, code in _blocks_of("yaml")
        if re.search(r"^(mcp_servers|http_tools):", code, re.M)
    ]
    models_files = [(where, code) for where, code in _blocks_of("json") if '"providers"' in code]
    assert len(tools_files) >= 2 and len(models_files) >= 2
    for where, code in tools_files:
        for name in re.findall(r"\$\{(\w+)\}", code):
            monkeypatch.setenv(name, "a-stand-in-value-of-the-docs-test")
        try:
            parse_tools_config(code, where)
        except ToolsConfigError as exc:
            pytest.fail(str(exc))
    for where, code in models_files:
        try:
            ModelsFile.model_validate_json(code)
        except ValidationError as exc:
            pytest.fail(f"{where}: {exc}")


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


@pytest.mark.parametrize("page", DOCS, ids=[page.name for page in DOCS])
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        missing_anchor = bool(anchor) and linked.suffix == ".md" and anchor not in _anchors(linked)
        if not linked.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links that resolve to nothing: {broken}"
