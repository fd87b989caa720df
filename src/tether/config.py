"""Configuration (docs/configuration.md): ``tether.toml``, by ``--config`` or ``TETHER_CONFIG``.

Every section is optional; a missing file means the defaults (an embedded SQLite ledger in
``.tether/ledger.db`` and no agents). Unknown keys are errors, so a typo never silently does
nothing.

The sections are msgspec structs (frozen): validating one costs microseconds and defining them
next to nothing, where pydantic models took about 70 ms to build at every start of the CLI.
``model_validate`` and ``model_copy`` keep the names callers already use.
"""

from __future__ import annotations

import enum
import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar

import msgspec

from tether.errors import BadLedgerUrl, ConfigError

__all__ = [
    "DEFAULT_BUDGET",
    "AccessConfig",
    "ActorBudget",
    "ActorLimits",
    "AgentConfig",
    "BridgesConfig",
    "Config",
    "CustodyConfig",
    "FollowupConfig",
    "HarnessConfig",
    "LedgerConfig",
    "LimitsConfig",
    "MatrixBridgeConfig",
    "ModelCost",
    "NetworkKind",
    "ProviderConfig",
    "RetentionConfig",
    "SandboxKind",
    "ServiceBudgets",
    "ServiceConfig",
    "ServiceLimits",
    "TelemetryConfig",
    "WebhookEndpoint",
    "WebhooksConfig",
    "WorkspaceKind",
    "load_config",
    "parse_config",
]

DEFAULT_BUDGET = 240_000
DEFAULT_LEDGER_URL = "sqlite:.tether/ledger.db"


Positive = Annotated[int, msgspec.Meta(gt=0)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeSeconds = Annotated[float, msgspec.Meta(ge=0)]
OtelName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]


def _decode_extra(kind: type, value: Any) -> Any:
    # The one type TOML does not have: paths arrive as strings.
    if kind is Path and isinstance(value, str | Path):
        return Path(value)
    raise ValueError(f"expected {kind.__name__}, got {type(value).__name__}")


_S = TypeVar("_S", bound="_Section")


class _Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    @classmethod
    def model_validate(cls, data: Any) -> Self:
        """Validate a mapping (parsed TOML) into this section; ``msgspec.ValidationError``
        names the first bad key."""
        return msgspec.convert(data, cls, dec_hook=_decode_extra)

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Self:
        """A copy with ``update``'s fields replaced (not validated, like pydantic's)."""
        return msgspec.structs.replace(self, **(update or {}))


class LedgerConfig(_Section, frozen=True):
    url: str = DEFAULT_LEDGER_URL


class FollowupConfig(_Section, frozen=True):
    budget_bytes: Positive = DEFAULT_BUDGET
    notes_max_count: NonNegative = 32
    notes_max_bytes: NonNegative = 16_000
    media_max_bytes: NonNegative = 5_000_000
    """Attachment limit for one top-level media payload (base64 bytes)."""
    tool_media_max_bytes: NonNegative = 1_000_000
    """Attachment limit for one media payload inside a tool result (base64 bytes)."""
    media_max_total_bytes: NonNegative = 20_000_000
    """Attachment limit for all media of one view together."""
    request_max_bytes: Positive | None = None
    """The largest request a run admits, in UTF-8 bytes (default: a quarter of the budget, so
    the request can always be quoted whole as the next run's previous request)."""

    @property
    def request_limit(self) -> int:
        return self.request_max_bytes or max(1, self.budget_bytes // 4)


class ModelCost(_Section, frozen=True):
    """``[providers.X.cost]``: the model's price in USD per million tokens, which pi's
    ``models.json`` declares so that pi reports each call's cost (all 0: pi reports none)."""

    input: NonNegativeFloat = 0.0
    output: NonNegativeFloat = 0.0
    cache_read: NonNegativeFloat = 0.0
    cache_write: NonNegativeFloat = 0.0

    def to_pi(self) -> dict[str, float] | None:
        """pi's ``cost`` of a model (None when every price is 0: pi's own default)."""
        prices = {
            "input": self.input,
            "output": self.output,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
        }
        return prices if any(prices.values()) else None


class ProviderConfig(_Section, frozen=True):
    base_url: str
    api: str = "openai-completions"
    api_key_env: str | None = None
    context_window: Positive = 128_000
    max_tokens: Positive = 4096
    compat: dict[str, Any] = {}
    """Passed through to pi's models.json ``compat`` for this provider's models."""
    cost: ModelCost = ModelCost()
    """The price pi computes each call's cost with (USD per million tokens; none by default)."""
    otel_provider_name: OtelName | None = None
    """Its ``gen_ai.provider.name`` on spans (default: the conventions' name of ``api``)."""


class SandboxKind(enum.StrEnum):
    """How a run's pi and its tools are confined (docs/security.md)."""

    BWRAP = "bwrap"
    """bubblewrap: the default."""
    NONE = "none"
    """Unconfined: an explicit opt-out, shown in the run's log and by ``tether doctor``."""


class WorkspaceKind(enum.StrEnum):
    """Where a session's runs work (``[agents.X] workspace``)."""

    SESSION = "session"
    """A directory of the session's own, made at its first run from the agent's workdir (a copy,
    or a git worktree on a branch of the session's): the default."""
    AGENT = "agent"
    """The agent's workdir itself, shared by every session of the agent: an explicit opt-in,
    shown in the run's log and by ``tether doctor``."""


class NetworkKind(enum.StrEnum):
    """What a sandboxed run may reach over the network."""

    PROVIDER = "provider"
    """Only the provider forwarder and the tools socket (a network namespace of its own: the
    host's loopback, and so a local PostgreSQL or ``tether serve``, is unreachable)."""
    HOST = "host"
    """The host's network, as tether itself sees it."""


GiB = 1024**3


class LimitsConfig(_Section, frozen=True):
    """Resource limits of every process in a sandboxed run (``setrlimit``, hard and soft)."""

    processes: Positive = 4096
    """``RLIMIT_NPROC``. The kernel counts every process and thread of the user on the host
    against it (a desktop session has hundreds), and does not apply it to root."""
    memory_bytes: Positive = 4 * GiB
    """``RLIMIT_DATA``: the writable memory of each process (pi's own included)."""
    file_size_bytes: Positive = 1 * GiB
    """``RLIMIT_FSIZE``: the largest file a process may write."""


class AgentConfig(_Section, frozen=True):
    provider: str
    model: str
    effort: Literal["off", "minimal", "low", "medium", "high", "xhigh"] = "off"
    system_prompt: str | None = None
    tools: list[str] = msgspec.field(default_factory=lambda: ["read", "bash"])
    deadline_s: PositiveSeconds = 600.0
    checkpoint_min_time_s: NonNegativeSeconds = 30.0
    """A checkpoint is attempted only when at least this much of the deadline remains."""
    summary_max_bytes: Positive = 60_000
    """A continuation summary over this many bytes is refused (``over_bound``); the bound is
    capped at a quarter of the follow-up budget, so the next view can always hold it."""
    anchors_max_bytes: NonNegative = 8_000
    """The byte bound of a continuation checkpoint's anchors (exact identifiers taken from the
    rows it covers), whatever the follow-up budget (the next view quotes the newest that fit and
    names the rest); 0 stores none."""
    workdir: Path | None = None
    """The template of each session's workspace, or with ``workspace = "agent"`` where every
    session's tools run (relative to the config file; default: the current directory). It must
    not contain the ledger file, the config, the run directories or the workspaces."""
    workspace: WorkspaceKind = WorkspaceKind.SESSION
    """Each session works in a workspace of its own made from ``workdir`` (default), or
    ``"agent"``: every session works in ``workdir`` itself."""
    env: dict[str, str] = {}
    """Variables the agent's tools get, besides PATH, HOME, LANG, TERM and a private TMPDIR."""
    sandbox: SandboxKind = SandboxKind.BWRAP
    """pi and its tools in bubblewrap (docs/security.md), or ``"none"``: unconfined, knowingly."""
    network: NetworkKind = NetworkKind.PROVIDER
    """A sandboxed run's network: the provider only (default), or the host's."""
    limits: LimitsConfig = LimitsConfig()
    """A sandboxed run's resource limits."""
    images: bool = False
    """The agent's model takes images: pi's ``models.json`` declares ``input: ["text",
    "image"]`` and ``POST …/requests`` accepts ``images`` for the agent (else 422)."""
    max_turns: NonNegative = 200
    """The most turns (provider calls) one run's task turn may take; the next one stops the
    run softly (``turn_limit``). 0: no bound (tether.harness.bounds)."""
    max_tool_calls: NonNegative = 500
    """The most tool calls one run may make; the next one stops it softly
    (``tool_call_limit``). 0: no bound."""
    max_repeated_tool_calls: NonNegative = 8
    """The most times in a row one run may call the same tool with the same arguments; the
    next such call stops it softly (``repeated_tool_call``). 0: no bound."""


class HarnessConfig(_Section, frozen=True):
    runs_dir: Path | None = None
    """Where each run keeps its pi agent dir, session file and log (default: ``.tether/runs``
    beside the config file, or in the working directory)."""
    workspaces_dir: Path | None = None
    """Where sessions keep their workspaces, one directory each (default: ``.tether/workspaces``
    beside the config file, or in the working directory). With several hosts, a path every host
    mounts at the same place."""
    stop_grace_s: PositiveSeconds = 5.0
    """How long a stop waits for pi to settle after ``abort``, and for it to exit after its
    stdin closes, before escalating."""
    keep_recent_tokens: NonNegative | None = None
    """pi's ``compaction.keepRecentTokens`` (default: min(20000, context_window / 4,
    followup.budget_bytes / 16), so a continuation checkpoint always has something to compact)."""
    reserve_tokens: NonNegative | None = None
    """pi's ``compaction.reserveTokens`` (default: min(16384, max(max_tokens, window / 4)))."""
    storage_retry_s: NonNegativeSeconds = 30.0
    """How long a run keeps retrying ledger writes that failed (a full disk, a lost connection)
    before it ends with the error, naming where its answer is kept."""
    pi_settings: dict[str, Any] = {}
    """Merged (deeply) into every run's pi ``settings.json``,
    e.g. ``{retry = {baseDelayMs = 500}}``."""


class CustodyConfig(_Section, frozen=True):
    """Session custody (docs/architecture.md#custody)."""

    lease_s: PositiveSeconds = 30.0
    """A live run's lease lasts this long after its last heartbeat (heartbeats come every
    third of it)."""
    detached: bool = True
    """pi runs detached from the harness under a keeper (commands through a FIFO, events to a
    file, both in the run directory), so a run outlives a lost harness. Off: pi is the
    harness's child and dies with it."""
    wait_poll_s: PositiveSeconds = 0.2
    """How often a waiting ``tether run`` asks whether its turn has come."""


class AccessConfig(_Section, frozen=True):
    grants: dict[str, list[str]] = {}
    """actor -> source patterns (fnmatch) it is admitted to."""


class ActorLimits(_Section, frozen=True):
    """``[service.limits.actors."user:ana"]``: one actor's own limits; a key left out is the
    default's (``[service.limits]``)."""

    queued: NonNegative | None = None
    live: NonNegative | None = None
    per_minute: NonNegative | None = None


class ServiceLimits(_Section, frozen=True):
    """What one actor may ask of the service, counted in the ledger (so across every serve
    process on one PostgreSQL): over a limit a request is refused with 429 and nothing is
    written. The CLI has no limits."""

    queued: NonNegative = 20
    """The actor's runs waiting to start (status ``queued``)."""
    live: NonNegative = 4
    """The actor's runs going at once (status ``running``): a request is refused while the
    actor has this many, and workers start no more of its queued runs meanwhile."""
    per_minute: NonNegative = 60
    """Requests (runs created) in the last 60 seconds."""
    actors: dict[str, ActorLimits] = {}
    """Actor -> its own limits (``[service.limits.actors."user:ana"] queued = 100``)."""

    def of(self, actor: str) -> tuple[int, int, int]:
        """The actor's (queued, live, per_minute)."""
        own = self.actors.get(actor)
        if own is None:
            return self.queued, self.live, self.per_minute
        return (
            self.queued if own.queued is None else own.queued,
            self.live if own.live is None else own.live,
            self.per_minute if own.per_minute is None else own.per_minute,
        )


class ActorBudget(_Section, frozen=True):
    """``[service.budgets.actors."user:ana"]``: one actor's own budget; a key left out is the
    default's (``[service.budgets]``)."""

    tokens_per_day: NonNegative | None = None
    cost_per_day: NonNegativeFloat | None = None


class ServiceBudgets(_Section, frozen=True):
    """What one actor's runs may use in a UTC day, summed in the ledger from every run's usage
    (tether.usage): over it a request is refused (429) and a live run that crosses it is
    stopped softly. None: no bound (the default)."""

    tokens_per_day: NonNegative | None = None
    """Tokens (pi's ``totalTokens``: input, output, cache read and write) a day."""
    cost_per_day: NonNegativeFloat | None = None
    """USD a day, as pi prices the calls (``[providers.X.cost]``)."""
    actors: dict[str, ActorBudget] = {}
    """Actor -> its own budget (``[service.budgets.actors."user:ana"] tokens_per_day = …``)."""

    def of(self, actor: str) -> tuple[int | None, float | None]:
        """The actor's (tokens_per_day, cost_per_day); None where it has no bound."""
        own = self.actors.get(actor, ActorBudget())
        return (
            self.tokens_per_day if own.tokens_per_day is None else own.tokens_per_day,
            self.cost_per_day if own.cost_per_day is None else own.cost_per_day,
        )


class WebhookEndpoint(_Section, frozen=True):
    """``[[service.webhooks.endpoints]]``: where run ends are POSTed (tether.service.webhooks)."""

    url: Annotated[str, msgspec.Meta(pattern=r"^https?://[^\s]+$")]
    secret_env: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    """The environment variable holding the signing secret (never the secret itself)."""
    events: list[Literal["run.ended"]] = msgspec.field(default_factory=lambda: ["run.ended"])
    statuses: list[Literal["finished", "failed", "interrupted"]] = msgspec.field(
        default_factory=lambda: ["finished", "failed", "interrupted"]
    )
    """The run statuses whose ends are sent (default: every one)."""
    actor: str | None = None
    """The actor the endpoint reads as: events of sessions it is not admitted to are not sent,
    and an answer only when it is admitted to its sources (default: no actor, so only what
    carries no sources)."""


class WebhooksConfig(_Section, frozen=True):
    """``[service.webhooks]``: run ends POSTed, signed, from a durable outbox in the ledger."""

    endpoints: list[WebhookEndpoint] = []
    max_attempts: Positive = 12
    """Attempts per delivery before it is given up (recorded as ``failed``)."""
    backoff_base_s: PositiveSeconds = 2.0
    """The wait after the first failed attempt; it doubles after each one …"""
    backoff_cap_s: PositiveSeconds = 3600.0
    """… up to this (each wait jittered between half and all of it)."""
    timeout_s: PositiveSeconds = 10.0
    """One attempt's limit: connect, send, answer."""
    concurrency: Positive = 4
    """Attempts in flight at once per endpoint (endpoints never wait for each other)."""
    poll_s: PositiveSeconds = 1.0
    """How often a delivering process looks for new run ends and deliveries due."""

    def __post_init__(self) -> None:
        urls = [e.url for e in self.endpoints]
        if len(set(urls)) != len(urls):
            raise ValueError("an endpoint's url must be unique (it keys its deliveries)")


class ServiceConfig(_Section, frozen=True):
    """``tether serve`` and ``tether worker`` (docs/contracts.md#the-http-api)."""

    tokens: dict[str, str] = {}
    """SHA-256 hex of a bearer token -> the actor its requests act as (``"…hex…" = "user:ana"``)."""
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    poll_s: PositiveSeconds = 0.2
    """How often an idle worker looks for queued runs (and a stream for new rows). A request
    posted to the same serve process wakes its idle workers at once."""
    drain_s: NonNegativeSeconds = 30.0
    """On SIGTERM, how long live runs may go on before they are handed over (lease released)."""
    relay_wait_s: NonNegativeSeconds = 5.0
    """How long a ``steer``/``follow_up`` request waits for the worker holding the live run to
    take it before it is answered as queued (it then becomes the session's next run)."""
    admins: list[str] = []
    """Actors that may erase over the API (``POST /v1/erasures``; docs/operations.md)."""
    max_body_bytes: Positive | None = None
    """The largest request body the service reads; a larger one is refused with 413 before it
    is read (default: :meth:`Config.body_limit`, room for the largest admissible request)."""
    operators: list[str] = []
    """Actors that may stop or withdraw anyone's run and clear a refusing session over the API."""
    limits: ServiceLimits = ServiceLimits()
    """What one actor may queue, run at once and ask a minute (``[service.limits]``)."""
    budgets: ServiceBudgets = ServiceBudgets()
    """What one actor's runs may use in a day, in tokens and cost (``[service.budgets]``)."""
    head_timeout_s: PositiveSeconds = 10.0
    """A request's head must arrive within this many seconds of its connection opening (or of
    the answer before it on the connection); a connection that has not sent one is closed."""
    max_connections: Positive = 512
    """The connections a serve process holds open at once. Past it, a new connection takes the
    place of the one that has waited longest for a request head, or is closed at once when every
    one is busy with a request; kept well below the usual 1,024 open-files limit."""
    webhooks: WebhooksConfig = WebhooksConfig()
    """Run ends POSTed to endpoints (``[service.webhooks]``, tether.service.webhooks)."""

    def __post_init__(self) -> None:
        for digest in self.tokens:
            if len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
                raise ValueError(
                    f"key {digest[:12]!r}… is not the SHA-256 hex of a token (64 lowercase hex "
                    "characters: `printf %s TOKEN | sha256sum`)"
                )


class TelemetryConfig(_Section, frozen=True):
    """Traces (docs/operations.md#traces); where they go, the ``OTEL_*`` variables say."""

    content: bool = False
    """Put what people and agents wrote (the request, the answer, a tool's arguments) on spans
    as attributes. Off: spans carry sizes, names, times and tether's decisions only."""


class RetentionConfig(_Section, frozen=True):
    """Retention (docs/operations.md#erasure-and-retention): sessions idle this long are erased."""

    idle_days: Positive | None = None
    """Erase a session when its newest activity (created, a run started or ended, a note) is
    this many days old; unset keeps every session. ``tether retention apply`` applies it, and
    the service's workers once a day."""


# ---- chat bridges (docs/bridges.md, tether.bridges) ---------------------------------------------

MatrixUserId = Annotated[str, msgspec.Meta(pattern=r"^@[^:\s]+:[^\s]+$")]
"""``@localpart:server``."""
MatrixRoom = Annotated[str, msgspec.Meta(pattern=r"^(![^\s]+|#[^:\s]+:[^\s]+)$")]
"""A room id (``!opaque:server``, or ``!opaque`` from room version 12) or alias
(``#name:server``)."""
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class MatrixBridgeConfig(_Section, frozen=True):
    """``[bridges.matrix]``: a Matrix bot account whose threads are sessions."""

    homeserver: Annotated[str, msgspec.Meta(pattern=r"^https?://[^\s]+$")]
    """The homeserver's client-server API base URL (``http://127.0.0.1:8008``)."""
    user: MatrixUserId
    """The bot's Matrix user id."""
    token_env: EnvName = "TETHER_MATRIX_TOKEN"
    """The environment variable holding the bot's access token (never the token itself)."""
    rooms: dict[MatrixRoom, str] = {}
    """Room id or alias -> the agent that answers there; the bot ignores every other room."""
    actors: dict[MatrixUserId, str] = {}
    """Matrix user id -> the actor its messages act as (and so its grants); an unlisted user is
    ``matrix:<user id>``."""
    split_chars: Annotated[int, msgspec.Meta(ge=200, le=30_000)] = 12_000
    """An answer longer than this (in characters of Markdown) is posted as several messages,
    split at paragraph, then line, then word boundaries."""
    lease_s: PositiveSeconds = 30.0
    """How long one attempt to post a message holds it before another process may try."""
    retry_s: PositiveSeconds = 2.0
    """The wait before posting again after a failure that named no wait (the homeserver down);
    it doubles after each one, up to 5 minutes. ``M_LIMIT_EXCEEDED`` waits what it says."""
    poll_s: PositiveSeconds = 0.5
    """How often the bridge looks for runs that ended and messages due."""
    sync_timeout_s: PositiveSeconds = 30.0
    """How long one sync (long poll) waits for new events."""

    def actor_of(self, user: str) -> str:
        return self.actors.get(user) or f"matrix:{user}"


class BridgesConfig(_Section, frozen=True):
    """``[bridges]``: chat platforms whose threads are sessions (``tether bridge …``)."""

    matrix: MatrixBridgeConfig | None = None


# ---- end of chat bridges ------------------------------------------------------------------------


class Config(_Section, frozen=True):
    ledger: LedgerConfig = LedgerConfig()
    followup: FollowupConfig = FollowupConfig()
    providers: dict[str, ProviderConfig] = {}
    agents: dict[str, AgentConfig] = {}
    access: AccessConfig = AccessConfig()
    harness: HarnessConfig = HarnessConfig()
    custody: CustodyConfig = CustodyConfig()
    service: ServiceConfig = ServiceConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    retention: RetentionConfig = RetentionConfig()
    bridges: BridgesConfig = BridgesConfig()
    path: Path | None = None
    """Where this configuration was read from (None for the defaults)."""

    def agent(self, name: str) -> AgentConfig:
        try:
            return self.agents[name]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise ConfigError(
                f"unknown agent {name!r} (configured: {known}); add [agents.{name}] to "
                f"{self.path or 'tether.toml'}"
            ) from None

    @property
    def body_limit(self) -> int:
        """``[service] max_body_bytes``, or room for the largest admissible request: its text at
        ``[followup] request_max_bytes`` with every byte JSON-escaped (``\\u0001`` is 6 bytes
        for 1), and 64 KiB for the rest of the body (agent, request_id, deliver); when an agent
        takes images, ``[followup] media_max_total_bytes`` more for them (base64)."""
        images = any(a.images for a in self.agents.values())
        media = self.followup.media_max_total_bytes if images else 0
        return self.service.max_body_bytes or 6 * self.followup.request_limit + 65_536 + media

    def workdir(self, name: str) -> Path:
        """The agent's working directory, resolved (relative to the config file)."""
        chosen = self.agent(name).workdir
        if chosen is None:
            return Path.cwd().resolve()
        base = self.path.parent if self.path else Path.cwd()
        return (chosen if chosen.is_absolute() else base / chosen).resolve()

    def provider(self, name: str) -> ProviderConfig:
        try:
            return self.providers[name]
        except KeyError:
            known = ", ".join(sorted(self.providers)) or "none"
            raise ConfigError(
                f"unknown provider {name!r} (configured: {known}); add [providers.{name}] to "
                f"{self.path or 'tether.toml'}"
            ) from None


def _validate(source: Path, prefix: str, kind: type[_S], data: Any) -> _S:
    try:
        return kind.model_validate(data)
    except RecursionError:
        raise ConfigError(f"{source}: {prefix or 'a value'}: nests too deeply") from None
    except msgspec.ValidationError as exc:
        problem, _, where = str(exc).partition(" - at `$")
        parts = [prefix, where.rstrip("`").lstrip(".")]
        if problem.startswith("Object contains unknown field `"):
            parts.append(problem.removeprefix("Object contains unknown field `").rstrip("`"))
            problem = "unknown key"
        key = ".".join(p for p in parts if p)
        raise ConfigError(f"{source}: {key}: {problem}" if key else f"{source}: {problem}") from exc


def ledger_file(url: str) -> Path | None:
    """The file a ledger URL names (``sqlite:///ABSOLUTE/PATH``, or ``sqlite:RELATIVE/PATH``
    from the working directory); None for ``memory:`` and ``postgresql://``. A URL no ledger
    takes is :class:`BadLedgerUrl`, as opening it would be."""
    if url == "memory:" or url.startswith(("postgresql://", "postgres://")):
        return None
    if not url.startswith("sqlite:"):
        raise BadLedgerUrl(
            f"unknown ledger URL {url!r}: use memory:, sqlite:///PATH or postgresql://USER@HOST/DB"
        )
    raw = url.removeprefix("sqlite:")
    raw = "/" + raw.lstrip("/") if raw.startswith("//") else raw
    if not raw or "\x00" in raw:
        raise BadLedgerUrl(f"not a SQLite ledger URL: {url!r} (it names no file)")
    return Path(raw).resolve()


def load_config(path: str | Path | None = None) -> Config:
    """Read the configuration from ``path``, else ``$TETHER_CONFIG``, else ``./tether.toml`` if it
    exists, else the defaults."""
    explicit = path is not None or "TETHER_CONFIG" in os.environ
    chosen = Path(path or os.environ.get("TETHER_CONFIG") or "tether.toml")
    try:
        exists = chosen.exists()
    except (OSError, ValueError) as exc:  # a NUL byte, a name too long
        raise ConfigError(f"cannot use config path {str(chosen)!r}: {exc}") from exc
    if not exists:
        if explicit:
            raise ConfigError(f"config file {chosen} does not exist")
        return Config()
    try:
        raw = chosen.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {chosen}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{chosen}: not UTF-8 text (invalid byte at offset {exc.start})") from exc
    return parse_config(text, chosen)


def _name_problem(name: str) -> str | None:
    """Why a section's name is not an id (the rules of ``tether.ids.id_problem``, which sits on
    this module's floor: tests/test_config_names.py checks that the two agree), or None."""
    if not name:
        return "must not be empty"
    if len(name) > 1024:
        return f"must be at most 1024 characters, not {len(name)}"
    if not name.isprintable():
        bad = next(ch for ch in name if not ch.isprintable())
        return f"must be printable on one line (it holds {bad!a})"
    return None


def _toml_key(name: str) -> str:
    """``name`` as a TOML key is written: quoted unless bare."""
    bare = name and all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in name)
    return name if bare else json.dumps(name)


def parse_config(text: str, chosen: Path) -> Config:
    """The configuration in ``text`` (read from ``chosen``), or :class:`ConfigError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{chosen}: invalid TOML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{chosen}: invalid TOML: arrays or tables nest too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError(f"{chosen}: invalid TOML value: {exc}") from exc
    # Named sections one by one first, so an error names the agent or provider, not "[...]".
    for section, kind in (("providers", ProviderConfig), ("agents", AgentConfig)):
        entries = data.get(section)
        for name, body in entries.items() if isinstance(entries, dict) else ():
            # A name is an id: it is given on command lines (--agent) and stored in the ledger.
            if (problem := _name_problem(name)) is not None:
                raise ConfigError(
                    f"{chosen}: [{section}.{_toml_key(name)}]: the name {problem}; "
                    f"rename the section (e.g. [{section}.reviewer])"
                )
            _validate(chosen, f"{section}.{name}", kind, body)
    config = _validate(chosen, "", Config, {**data, "path": chosen.resolve()})
    for name, agent in config.agents.items():
        if agent.provider not in config.providers:
            raise ConfigError(
                f"{chosen}: agents.{name}.provider = {agent.provider!r} names no [providers.…] "
                "section"
            )
    _check_bridges(chosen, config)
    return config


def _check_bridges(chosen: Path, config: Config) -> None:
    """Each bridged room names a configured agent, and each mapped actor is an id."""
    matrix = config.bridges.matrix
    if matrix is None:
        return
    for room, agent in matrix.rooms.items():
        if agent not in config.agents:
            known = ", ".join(sorted(config.agents)) or "none"
            raise ConfigError(
                f"{chosen}: bridges.matrix.rooms.{_toml_key(room)} = {agent!r} names no "
                f"[agents.…] section (configured: {known})"
            )
    for user, actor in matrix.actors.items():
        if (problem := _name_problem(actor)) is not None:
            raise ConfigError(
                f"{chosen}: bridges.matrix.actors.{_toml_key(user)}: the actor {problem}"
            )
