"""The Prometheus metrics (`GET /metrics` with PARLEY_METRICS=1), on a registry of their own.

Labels are bounded by construction: turn status, model names the server knows (others are `other`), tool
names the registry holds (others are `unknown`), the tool's source, the outcome, error codes, commit kinds.
No session, turn or message id is ever a label value.

Several worker processes: set PROMETHEUS_MULTIPROC_DIR to an empty directory shared by them before they
start; each process then writes its values there and a scrape of any worker adds them up (prometheus-
client's multiprocess mode; gauges sum the live processes'). Without it the values are the process's own.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

# A first token takes milliseconds to seconds; a response seconds to minutes; a turn up to many minutes.
FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RESPONSE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TURN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
TOOL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DISCONNECT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
QUEUE_BUCKETS = (1, 2, 3, 5, 10, 20, 50, 100)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class Metrics:
    """Every metric of the service; the hooks (hooks.py) update them, `render` answers a scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._turns_and_models(self.registry)
        self._tools_streams_and_storage(self.registry)
        self._replicas(self.registry)

    def _turns_and_models(self, r: CollectorRegistry) -> None:
        self.turns_started = Counter("parley_turns_started", "Turns started.", registry=r)
        self.turns_ended = Counter("parley_turns_ended", "Turns ended, by status.", ["status"], registry=r)
        self.turn_seconds = Histogram(
            "parley_turn_duration_seconds",
            "Turn duration, by status.",
            ["status"],
            buckets=TURN_BUCKETS,
            registry=r,
        )
        self.first_token_seconds = Histogram(
            "parley_model_first_token_seconds",
            "From a model call's start to its first text or tool call fragment.",
            ["model"],
            buckets=FIRST_TOKEN_BUCKETS,
            registry=r,
        )
        self.response_seconds = Histogram(
            "parley_model_response_seconds",
            "A model call, start to end.",
            ["model"],
            buckets=RESPONSE_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "parley_model_tokens",
            "Tokens by model and direction (input, output).",
            ["model", "direction"],
            registry=r,
        )
        self.tokens_estimated = Counter(
            "parley_model_tokens_estimated",
            "Tokens counted by LiteLLM's tokenizer because the provider sent no usage "
            "(counted in parley_model_tokens too).",
            ["model", "direction"],
            registry=r,
        )
        self.provider_errors = Counter(
            "parley_provider_errors", "Failed model calls, by error code.", ["model", "code"], registry=r
        )

    def _tools_streams_and_storage(self, r: CollectorRegistry) -> None:
        self.tool_calls = Counter(
            "parley_tool_calls",
            "Tool calls by tool, source and outcome (ok, error, cancelled).",
            ["tool", "source", "outcome"],
            registry=r,
        )
        self.tool_seconds = Histogram(
            "parley_tool_duration_seconds",
            "Tool call duration.",
            ["tool", "source"],
            buckets=TOOL_BUCKETS,
            registry=r,
        )
        self.open_streams = Gauge(
            "parley_open_streams", "Event streams open now.", registry=r, multiprocess_mode="livesum"
        )
        self.events_sent = Counter("parley_events_sent", "Events sent on event streams.", registry=r)
        self.session_states = Gauge(
            "parley_session_states",
            "Sessions whose runtime state this process holds (in use, or idle for under "
            "PARLEY_IDLE_SESSION_SECONDS).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.stream_channels = Gauge(
            "parley_stream_channels",
            "Sessions whose stream channel (recent events) this process holds (watched, or unwatched for "
            "under PARLEY_STREAM_CHANNEL_SECONDS).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.streams_dropped = Counter(
            "parley_streams_dropped_slow", "Streams ended because the client fell too far behind.", registry=r
        )
        self.resumes = Counter("parley_stream_resumes", "Streams opened at a position (resumed).", registry=r)
        self.resyncs = Counter("parley_stream_resyncs", "Streams that began with a resync.", registry=r)
        self.cancels = Counter("parley_cancels", "Stops that stopped a running turn.", registry=r)
        self.branch_operations = Counter(
            "parley_branch_operations",
            "Branch operations done: regenerate, edit, activate, fork.",
            ["operation"],
            registry=r,
        )
        self.disconnect_seconds = Histogram(
            "parley_cancel_disconnect_seconds",
            "From a stop reaching a model stream to its upstream connection closed.",
            buckets=DISCONNECT_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "parley_db_commit_seconds",
            "Database commit time, by kind (batch, turn, request).",
            ["kind"],
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.auth_failures = Counter(
            "parley_auth_failures",
            "Requests refused for their credentials, by reason (missing, key, or the token check that "
            "failed: expired, signature, audience, ...); never a piece of the credential.",
            ["reason"],
            registry=r,
        )
        self.queue_depth = Histogram(
            "parley_queue_depth",
            "Messages waiting in a session's line when one more joins it.",
            buckets=QUEUE_BUCKETS,
            registry=r,
        )

    def _replicas(self, r: CollectorRegistry) -> None:
        """With PARLEY_REDIS_URL: the fan-out, the limits and the lease fence."""
        self.redis_connected = Gauge(
            "parley_fanout_redis_connected",
            "1 while the fan-out reads Redis streams, 0 while it polls the event log (PARLEY_REDIS_URL).",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.fanout_backfilled = Counter(
            "parley_fanout_backfilled", "Events read from the log to fill a hole in the fan-out.", registry=r
        )
        self.limits_without_redis = Counter(
            "parley_limits_redis_unavailable",
            "Limit decisions (messages, streams) taken in this process's memory because Redis was away.",
            ["limit"],
            registry=r,
        )
        self.fenced_writes = Counter(
            "parley_fenced_writes",
            "Turn writes refused because this replica no longer holds the turn's lease, by what was refused "
            "(turn_done, turn_write, stream_batch).",
            ["what"],
            registry=r,
        )

    def render(self) -> tuple[bytes, str]:
        """The scrape's body and content type: this process's values, or every worker's in multiprocess."""
        if os.environ.get(MULTIPROC_ENV):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
