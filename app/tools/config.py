"""The tools file (`PARLEY_TOOLS_FILE`): the MCP servers and HTTP tools an operator plugs in.

This module owns reading that file (YAML or JSON; JSON is YAML, so one parser reads both), expanding
`${ENV_VAR}` references so secrets stay in the environment, and validating every entry. A file that
cannot be used raises `ToolsConfigError` with one line naming the entry and what is wrong: never the
value that was given, which may be a secret once expanded.

    mcp_servers:
      github:                              # model-visible names: github__<tool>
        url: https://mcp.example.com/mcp   # streamable HTTP
        headers: {Authorization: "Bearer ${GITHUB_TOKEN}"}
        approval: ["create_*", delete_issue]   # or `always`
      files:
        command: python                    # stdio: operator configuration only
        args: [-m, files_server]
        env: {ROOT: /srv/files}
        timeout: 20                        # seconds per call (default 60)
    http_tools:
      lookup_order:
        url: https://orders.example.com/tool
        description: Look an order up by its number.
        parameters: {type: object, properties: {number: {type: string}}, required: [number]}
        secret: ${ORDER_TOOL_SECRET}       # HMAC-SHA256 key of the signature header
        approval: always
    allow_private_hosts: [127.0.0.1]       # hosts HTTP tools may reach on private addresses
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "DEFAULT_MCP_TIMEOUT",
    "HttpToolConfig",
    "McpServerConfig",
    "ToolsConfig",
    "ToolsConfigError",
    "load_tools_config",
]

DEFAULT_MCP_TIMEOUT = 60.0
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# A server's name prefixes its tools' names (`server__tool`), which providers cap at 64 characters.
_SERVER_NAME = r"^[a-zA-Z0-9_-]{1,30}$"
_TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
_LOOPBACK_HTTP = r"^http://(127\.0\.0\.1|localhost)[:/]"


class ToolsConfigError(ValueError):
    """The tools file cannot be used; the message is one line, safe to print."""


ServerName = Annotated[str, Field(pattern=_SERVER_NAME)]
ToolName = Annotated[str, Field(pattern=_TOOL_NAME)]
Approval = Literal["always", "never"] | list[Annotated[str, Field(min_length=1)]]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class McpServerConfig(_Entry):
    """One MCP server: `url` (streamable HTTP) or `command` (stdio), never both."""

    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    timeout: float = Field(DEFAULT_MCP_TIMEOUT, gt=0, le=3600)
    max_result_chars: int = Field(20_000, ge=100)
    approval: Approval = "never"
    description: str = ""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.url is None) == (self.command is None):
            raise ValueError("give either url (streamable HTTP) or command (stdio)")
        if self.url is not None and not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError("url must be an http:// or https:// URL")
        if self.url is None and self.headers:
            raise ValueError("headers are for url servers only")
        if self.command is None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for command (stdio) servers only")
        return self

    @property
    def transport(self) -> Literal["http", "stdio"]:
        return "http" if self.url is not None else "stdio"


class HttpToolConfig(_Entry):
    """One HTTP tool: the model's arguments are POSTed to `url` as JSON, signed with `secret`."""

    url: str
    description: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    secret: str = Field(min_length=16)
    timeout: float = Field(30.0, gt=0, le=600)
    max_response_bytes: int = Field(100_000, ge=100, le=10_000_000)
    approval: Literal["always", "never"] = "never"

    @field_validator("url")
    @classmethod
    def _https(cls, url: str) -> str:
        # Plain http only for loopback test receivers, which must also be allow-listed to be reached.
        if not re.match(r"^https://[^/\s]+", url) and not re.match(_LOOPBACK_HTTP, url):
            raise ValueError("url must be an https:// URL")
        return url

    @field_validator("parameters")
    @classmethod
    def _schema(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        if parameters.get("type") != "object":
            raise ValueError('parameters must be a JSON schema of "type": "object"')
        from jsonschema import Draft202012Validator  # only for a file that declares HTTP tools
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError as exc:
            raise ValueError(f"parameters is not a valid JSON schema: {exc.message}") from None
        return parameters


class ToolsConfig(_Entry):
    mcp_servers: dict[ServerName, McpServerConfig] = Field(default_factory=dict)
    http_tools: dict[ToolName, HttpToolConfig] = Field(default_factory=dict)
    allow_private_hosts: list[str] = Field(default_factory=list)


def _expand(value: Any, where: str) -> Any:
    """Replaces `${VAR}` in every string of the parsed file; a missing variable names itself, not a value."""
    if isinstance(value, str):

        def lookup(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ToolsConfigError(f"{where}: environment variable {name} is not set")
            return os.environ[name]

        return _ENV_REF.sub(lookup, value)
    if isinstance(value, dict):
        return {key: _expand(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [_expand(item, f"{where}[{n}]") for n, item in enumerate(value)]
    return value


def _describe(exc: ValidationError, source: str) -> str:
    """The first problem as one line: where it is and what is wrong, without the input (maybe a secret)."""
    err = exc.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in err["loc"]) or "(top level)"
    message = str(err["msg"]).removeprefix("Value error, ")
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{source}: {where}: {message}{more}"


def parse_tools_config(text: str, source: str = "tools file") -> ToolsConfig:
    import yaml  # only when there is a file to read

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ToolsConfigError(f"{source} is not valid YAML or JSON{at}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ToolsConfigError(f"{source} must hold a mapping with mcp_servers and/or http_tools")
    try:
        return ToolsConfig.model_validate(_expand(raw, source))
    except ValidationError as exc:
        raise ToolsConfigError(_describe(exc, source)) from None


def load_tools_config(path: Path | None) -> ToolsConfig:
    """The validated tools file; an empty configuration without one."""
    if path is None:
        return ToolsConfig()
    source = f"PARLEY_TOOLS_FILE {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ToolsConfigError(f"{source} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ToolsConfigError(f"{source} is not UTF-8 text") from None
    return parse_tools_config(text, source)
