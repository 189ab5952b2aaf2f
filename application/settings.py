"""Typed settings, read from ``TURNLOG_*`` environment variables.

The interface builds one ``Settings`` at start-up and passes it down; nothing
reads the environment at import time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from turnlog.domain.turns import IDEMPOTENCY_WINDOW

NAMESPACE_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,39}")


class Settings(BaseSettings):
    """Everything a turnlog process can be configured with."""

    model_config = SettingsConfigDict(env_prefix="TURNLOG_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL. Unset: an embedded server in DATA_DIR/pg.",
    )
    namespace: str = Field(
        default="default",
        description="Namespace; stored in the schema turnlog_<namespace>.",
    )
    namespace_database_urls: dict[str, str] = Field(
        default_factory=dict,
        description='Per-namespace URLs (JSON): `{"ns": "postgresql://…"}`.',
    )
    data_dir: Path = Field(
        default=Path(".turnlog"),
        description="Embedded database, tool sandboxes and other local state.",
    )
    api_token: SecretStr | None = Field(
        default=None, description="Bearer token required on /v1 routes when set."
    )
    tenants_file: Path | None = Field(
        default=None,
        description="TOML file of hashed tokens, their namespace and role, and quotas;"
        " serve then serves every namespace in it (docs/tenants.md).",
    )
    provider: str = Field(default="fixture", description="Default model provider.")
    openai_base_url: str = Field(
        default="https://api.openai.com/v1", description="OpenAI-compatible endpoint."
    )
    openai_api_key: SecretStr | None = Field(default=None, description="Key for that endpoint.")
    openai_timeout: float = Field(
        default=60.0, gt=0, le=3600, description="Seconds to wait for one model reply."
    )
    openai_max_retries: int = Field(
        default=3, ge=0, le=10, description="Retries on 429, 5xx and connection errors."
    )
    openai_retry_backoff: float = Field(
        default=0.5, ge=0, le=60, description="First retry delay (s); doubles, with jitter."
    )
    openai_retry_max_delay: float = Field(
        default=20.0, ge=0, le=600, description="Longest wait before a retry, Retry-After included."
    )
    model: str = Field(default="fixture-1", description="Default model name.")
    max_steps: int = Field(default=8, ge=1, le=100, description="Model calls per turn.")
    snapshot_interval: int = Field(
        default=100, ge=2, description="Take a snapshot every N events of a session."
    )
    durability: Literal["by_class", "every_step"] = Field(
        default="by_class",
        description="`by_class`: a worker's claim rides on the next flush and a safe call's outcome"
        " goes with the turn's next save (lost, the step runs again: docs/durability.md);"
        " `every_step`: every save waits for the disk.",
    )
    idempotency_window: int = Field(
        default=IDEMPOTENCY_WINDOW,
        ge=1,
        le=100_000,
        description="A session remembers the `Idempotency-Key` of its last N keyed turns and"
        " of its open ones; a retry with an older key is a new turn (docs/long-sessions.md).",
    )
    context_max_turns: int | None = Field(
        default=None,
        ge=1,
        description="Context policy of new sessions that set none: at most this many turns"
        " after the latest summary in a request (unset: no limit).",
    )
    context_max_chars: int | None = Field(
        default=None,
        ge=1000,
        description="Context policy of new sessions that set none: a request longer than this"
        " many characters first has its oldest turns summarised (unset: no limit).",
    )
    turn_deadline_seconds: float | None = Field(
        default=None,
        gt=0,
        le=7 * 24 * 3600,
        description="Deadline of a turn whose submitter and session name none: the runtime"
        " cancels it (reason `deadline`) this many seconds after submission (unset: none).",
    )
    approval_policy: Literal["none", "side_effecting", "all"] = Field(
        default="none",
        description="Approval policy of new sessions that set none: which tool calls wait for"
        " an operator's approval (`none`; `side_effecting`; `all`). Tools declared"
        ' `approval = "required"` always wait.',
    )
    approval_tools: str | None = Field(
        default=None,
        description="Tools (built-in or declared) whose calls always wait for an operator's"
        " approval, comma-separated.",
    )
    retention_days: int | None = Field(
        default=None,
        ge=1,
        le=36500,
        description="Purge sessions closed over N days ago (docs/purge.md).",
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="Log lines: `text`, or `json` (one object per line)."
    )
    shell_tool: bool = Field(
        default=False, description="Offer the side-effecting `shell` tool (runs in the sandbox)."
    )
    shell_timeout: float = Field(
        default=60.0, gt=0, le=3600, description="Seconds a `shell` command may run."
    )
    sandbox: Literal["on", "off"] = Field(
        default="on",
        description="Tool processes run in an OS sandbox (bubblewrap; docs/containment.md)."
        " `off` runs them unconfined, and every start warns; set it only where no sandbox"
        " can be had.",
    )
    probes: bool = Field(
        default=True,
        description="Recovery asks a tool's probe (append_file's, a declared `probe`) before"
        " interrupting a turn whose owner died inside a side-effecting call (`off`: never).",
    )
    tools_file: Path | None = Field(
        default=None, description="TOML or JSON file declaring command tools (empty: unset)."
    )
    tool_modules: str | None = Field(
        default=None,
        description="Comma-separated Python modules whose `@turnlog.tool` functions are offered.",
    )
    provider_modules: str | None = Field(
        default=None,
        description="Comma-separated `module:factory` names of your own model providers"
        " (factory default: `provider`), besides the `turnlog.providers` entry points.",
    )
    default_tools: str | None = Field(
        default=None,
        description="Tools of a new session that names none, comma-separated (empty: none)."
        " Unset: every tool for the fixture provider; for others, all but the demo ones"
        " (echo, sleep, append_file).",
    )
    tool_output_bytes: int = Field(
        default=16384, ge=256, description="Output kept per stream of a command tool."
    )
    pool_size: int = Field(default=2, ge=1, description="Connections opened per pool.")
    pool_max_overflow: int = Field(default=8, ge=0, description="Extra connections per pool.")
    session_cache_size: int = Field(
        default=1000,
        ge=0,
        description="Sessions kept in memory per process (0: none); each load still "
        "reads the events stored since, so the cache is never stale.",
    )
    header_timeout: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Seconds a client has to send a request's headers (408, then closed).",
    )
    body_timeout: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds a client has to send a request's whole body (408, then closed).",
    )

    @field_validator("namespace")
    @classmethod
    def _namespace_is_identifier(cls, value: str) -> str:
        check_namespace(value)
        return value

    @field_validator("tools_file", "tenants_file", mode="before")
    @classmethod
    def _empty_path_is_unset(cls, value: object) -> object:
        """An empty value is no file: as a path, "" would be "." (a directory)."""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @property
    def default_tool_names(self) -> list[str] | None:
        """``default_tools`` as a list (None when unset)."""
        if self.default_tools is None:
            return None
        return split_names(self.default_tools)

    @field_validator("namespace_database_urls")
    @classmethod
    def _namespaces_are_identifiers(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            check_namespace(name)
        return value

    @property
    def namespace_database_url(self) -> str | None:
        """The URL of this namespace's server: its own, or DATABASE_URL (None: embedded)."""
        return self.namespace_database_urls.get(self.namespace) or self.database_url

    @property
    def schema_name(self) -> str:
        return schema_name(self.namespace)

    @property
    def sandbox_root(self) -> Path:
        return self.data_dir.resolve() / "sandboxes" / self.namespace


def schema_name(namespace: str) -> str:
    """The PostgreSQL schema that holds a namespace's tables."""
    return f"turnlog_{namespace}"


def split_names(text: str) -> list[str]:
    """Comma-separated names, blanks dropped: "echo, sleep" → ["echo", "sleep"]."""
    return [name.strip() for name in text.split(",") if name.strip()]


def check_namespace(value: str) -> None:
    """Refuse a namespace that is not a short lowercase identifier."""
    if not isinstance(value, str) or not NAMESPACE_PATTERN.fullmatch(value):
        raise ValueError(
            f"invalid namespace {value!r}: use a lowercase letter followed by up to 39 "
            "lowercase letters, digits or underscores"
        )


def settings_reference() -> str:
    """The configuration table of the README, generated from the fields above."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, info in Settings.model_fields.items():
        default = info.get_default(call_default_factory=True)
        shown = "unset" if default is None or default == {} else f"`{default}`"
        lines.append(f"| `TURNLOG_{name.upper()}` | {shown} | {info.description or ''} |")
    return "\n".join(lines)
