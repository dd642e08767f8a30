"""The JetStream API's answers as typed models, rendered as nats-server renders its Go structs.

Each answer is a frozen dataclass with its fields in the order of the server's response struct:
``type`` first (its embedded ``ApiResponse``), embedded structs (``ApiPaged``, ``*StreamInfo``,
``*ConsumerInfo``) marked :data:`~gateway.api.configs.EMBED` so their fields stand at the top level
as Go puts them, and ``omitempty`` marked where Go has it; :func:`~gateway.api.configs.to_json`
gives the server's JSON. A handler builds one of these and never a dict. The stream state stays the
map the stream builds, as its optional parts (subjects, deleted sequences) are asked for per
request. Errors are :mod:`gateway.api.errors` values, rendered by the router with the fields each
response type adds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.api.configs import EMBED, OMIT, ConsumerConfig, StreamConfig
from gateway.api.requests import RawReply, T

# ---- what stream and consumer answers carry -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Paged:
    """``ApiPaged``: where a page starts, how long pages are, how many there are in all."""

    total: int = 0
    offset: int = 0
    limit: int = 0


@dataclass(frozen=True, slots=True)
class SequenceInfo:
    """A consumer's last delivered (or ack floor) sequences, and when it last moved."""

    consumer_seq: int
    stream_seq: int
    last_active: str = field(default="", metadata=OMIT)


@dataclass(frozen=True, slots=True)
class PriorityGroupState:
    """A priority group's pin, as consumer info shows it: the pin's id, if there is one, and when it
    was given (Go's zero time when none: ``omitempty`` does not leave a time out)."""

    group: str
    pinned_client_id: str = field(default="", metadata=OMIT)
    pinned_ts: str = ""


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """``server.ConsumerInfo`` (without its cluster part). ``config`` is the map CONSUMER.LIST
    shows, without the server's metadata, where it differs from the config."""

    stream_name: str
    name: str
    created: str
    config: ConsumerConfig | Mapping[str, Any]
    delivered: SequenceInfo
    ack_floor: SequenceInfo
    num_ack_pending: int
    num_redelivered: int
    num_waiting: int
    num_pending: int
    push_bound: bool = field(default=False, metadata=OMIT)
    paused: bool = field(default=False, metadata=OMIT)
    pause_remaining: int = field(default=0, metadata=OMIT)
    ts: str = ""
    priority_groups: tuple[PriorityGroupState, ...] = field(default=(), metadata=OMIT)


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """``server.PeerInfo``: another gateway that could serve the stream (a live standby: it
    recovers the stream from the store, so it holds everything committed). ``active``: nanoseconds
    since the owner last saw its announcement change. No ``lag`` (there is no copy to lag) and no
    ``peer`` hash (gateways have no RAFT peer id)."""

    name: str
    current: bool
    active: int


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """``server.ClusterInfo`` as jetlake's gateways see it: its ``name`` is the JetStream domain
    they serve, ``leader`` the gateway that owns the store, ``replicas`` live standbys, up to the
    stream's replicas less one (none for R1, as a cluster shows an R1 stream). No RAFT fields."""

    name: str
    leader: str
    replicas: tuple[PeerInfo, ...] = field(default=(), metadata=OMIT)


@dataclass(frozen=True, slots=True)
class Gateways:
    """The live gateways of a store as the owner sees them: itself, and those standing by (each
    with nanoseconds since its announcement last changed)."""

    leader: str
    standbys: tuple[tuple[str, int], ...] = ()

    def cluster(self, domain: str, replicas: int) -> ClusterInfo:
        """The ``cluster`` of a stream (or consumer) of ``replicas``."""
        peers = tuple(PeerInfo(name, True, active) for name, active in self.standbys[: max(replicas - 1, 0)])
        return ClusterInfo(domain, self.leader, peers)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """``server.StreamInfo`` (without its origin parts beyond mirror and sources)."""

    config: StreamConfig
    created: str
    state: Mapping[str, Any]
    domain: str = field(default="", metadata=OMIT)
    cluster: ClusterInfo | None = field(default=None, metadata=OMIT)
    mirror: Mapping[str, Any] | None = field(default=None, metadata=OMIT)
    sources: Sequence[Mapping[str, Any]] | None = field(default=None, metadata=OMIT)
    ts: str = ""


@dataclass(frozen=True, slots=True)
class StoredMsg:
    """A message as MSG.GET returns it: headers and payload base64, left out when empty."""

    subject: str
    seq: int
    hdrs: str = field(default="", metadata=OMIT)
    data: str = field(default="", metadata=OMIT)
    time: str = ""


@dataclass(frozen=True, slots=True)
class AccountLimits:
    """An account without limits (jetlake has no accounts of its own: the hub's are its)."""

    max_memory: int = -1
    max_storage: int = -1
    max_streams: int = -1
    max_consumers: int = -1
    max_ack_pending: int = -1
    memory_max_stream_bytes: int = -1
    storage_max_stream_bytes: int = -1
    max_bytes_required: bool = False


@dataclass(frozen=True, slots=True)
class ApiStats:
    level: int
    total: int
    errors: int


# ---- the answers, in the server's struct order ------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AccountInfoResponse:
    type: str = T + "account_info_response"
    memory: int
    storage: int
    reserved_memory: int = 0
    reserved_storage: int = 0
    streams: int
    consumers: int
    limits: AccountLimits = field(default_factory=AccountLimits)
    domain: str = field(default="", metadata=OMIT)
    api: ApiStats


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamInfoResponse:
    type: str = T + "stream_info_response"
    paged: Paged = field(default_factory=Paged, metadata=EMBED)
    info: StreamInfo = field(metadata=EMBED)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamCreateResponse:
    """STREAM.CREATE (``did_create``) and, with its own type, STREAM.UPDATE."""

    type: str = T + "stream_create_response"
    info: StreamInfo = field(metadata=EMBED)
    did_create: bool = field(default=False, metadata=OMIT)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSnapshotResponse:
    """STREAM.SNAPSHOT: the stream's config (without the server's own metadata keys but the
    level asked for) and its state; the archive follows on the deliver subject."""

    type: str = T + "stream_snapshot_response"
    config: StreamConfig
    state: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamRestoreResponse:
    """STREAM.RESTORE: where the archive's chunks go."""

    type: str = T + "stream_restore_response"
    deliver_subject: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamsResponse:
    """A page of STREAM.NAMES (names; ``null`` for none) or STREAM.LIST (infos), by its type."""

    type: str
    paged: Paged = field(metadata=EMBED)
    #: LIST: infos; per-stream ownership, another gateway's stream as that gateway rendered it.
    streams: tuple[str, ...] | tuple[StreamInfo | Mapping[str, Any], ...] | None
    #: STREAM.LIST: the offline streams of the page, by name and with why (``JSApiStreamListResponse``).
    missing: tuple[str, ...] = field(default=(), metadata=OMIT)
    offline: dict[str, str] = field(default_factory=dict, metadata=OMIT)


@dataclass(frozen=True, slots=True, kw_only=True)
class SuccessResponse:
    """Stream, consumer and message deletes: it worked."""

    type: str
    success: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamPurgeResponse:
    type: str = T + "stream_purge_response"
    success: bool = True
    purged: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MsgGetResponse:
    type: str = T + "stream_msg_get_response"
    message: StoredMsg


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerInfoResponse:
    """CONSUMER.INFO and, with its own type, CONSUMER.CREATE."""

    type: str = T + "consumer_info_response"
    info: ConsumerInfo = field(metadata=EMBED)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumersResponse:
    """A page of CONSUMER.NAMES (names) or CONSUMER.LIST (infos), by its type."""

    type: str
    paged: Paged = field(metadata=EMBED)
    consumers: tuple[str, ...] | tuple[ConsumerInfo, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerPauseResponse:
    type: str = T + "consumer_pause_response"
    paused: bool
    pause_until: str
    pause_remaining: int = field(default=0, metadata=OMIT)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerUnpinResponse:
    """CONSUMER.UNPIN: the type alone (no ``success``)."""

    type: str = T + "consumer_unpin_response"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerResetResponse:
    type: str = T + "consumer_reset_response"
    info: ConsumerInfo = field(metadata=EMBED)
    reset_seq: int


#: Every answer a handler gives as JSON.
Response = (
    AccountInfoResponse
    | StreamInfoResponse
    | StreamCreateResponse
    | StreamSnapshotResponse
    | StreamRestoreResponse
    | StreamsResponse
    | SuccessResponse
    | StreamPurgeResponse
    | MsgGetResponse
    | ConsumerInfoResponse
    | ConsumersResponse
    | ConsumerPauseResponse
    | ConsumerResetResponse
    | ConsumerUnpinResponse
)
#: What an API handler answers: a typed response, raw replies (direct gets), or None where the
#: server stays silent.
Answer = Response | list[RawReply] | None
#: An API subject's handler with its subject's tokens bound: called with the request body.
Route = Callable[[bytes], Answer | Awaitable[Answer]]
