"""JetStream API errors as values: one table, one renderer.

Codes and descriptions are the ones nats-server's ``server/errors.json`` lists (read there, written
here as jetlake's own table) and each is pinned by a differential test against the real server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ApiError(Exception):
    code: int
    err_code: int
    description: str

    def render(self) -> dict[str, Any]:
        return {"code": self.code, "err_code": self.err_code, "description": self.description}

    def format(self, **fields: object) -> ApiError:
        """Fill the ``{placeholder}`` parts of a description."""
        text = self.description
        for key, value in fields.items():
            text = text.replace("{" + key + "}", str(value))
        return ApiError(self.code, self.err_code, text)


INVALID_JSON = ApiError(400, 10025, "invalid JSON: {err}")
CLUSTER_REQUIRED = ApiError(503, 10010, "JetStream clustering support required")
REQUIRED_API_LEVEL = ApiError(412, 10185, "JetStream minimum api level required")
NOT_EMPTY_REQUEST = ApiError(400, 10038, "expected an empty request payload")
STREAM_NOT_FOUND = ApiError(404, 10059, "stream not found")
#: A stream the server loaded but cannot serve (its config is unsupported or undecodable); jetlake
#: answers so for a stream a damaged catalog or removals file may hold rows of.
STREAM_OFFLINE = ApiError(500, 10194, "stream is offline: {err}")
STREAM_NAME_EXISTS = ApiError(400, 10058, "stream name already in use with a different configuration")
STREAM_MISMATCH = ApiError(400, 10056, "stream name in subject does not match request")
STREAM_SUBJECT_OVERLAP = ApiError(400, 10065, "subjects overlap with an existing stream")
STREAM_INVALID_CONFIG = ApiError(500, 10052, "{err}")
STREAM_TRANSFORM_INVALID_SOURCE = ApiError(400, 10155, "stream transform source: {err}")
STREAM_TRANSFORM_INVALID_DESTINATION = ApiError(400, 10156, "stream transform: {err}")
STREAM_STORE_FAILED = ApiError(503, 10077, "{err}")
CONSUMER_NOT_FOUND = ApiError(404, 10014, "consumer not found")
CONSUMER_INVALID_RESET = ApiError(400, 10204, "invalid reset: {err}")
CONSUMER_ALREADY_EXISTS = ApiError(400, 10148, "consumer already exists")
CONSUMER_DURABLE_NAME_NOT_MATCH_SUBJECT = ApiError(
    400, 10017, "consumer name in subject does not match durable name in request"
)
CONSUMER_CREATE = ApiError(500, 10012, "{err}")
CONSUMER_FILTER_NOT_MATCH_SUBJECT = ApiError(
    400, 10131, "Consumer create request did not match filtered subject from create subject"
)
CONSUMER_DOES_NOT_EXIST = ApiError(400, 10149, "consumer does not exist")
CONSUMER_EPHEMERAL_WITH_DURABLE = ApiError(
    400, 10020, "consumer expected to be ephemeral but a durable name was set in request"
)
CONSUMER_INVALID_POLICY = ApiError(400, 10094, "{err}")
CONSUMER_BOTH_FILTERS = ApiError(
    400, 10136, "consumer cannot have both FilterSubject and FilterSubjects specified"
)
CONSUMER_EMPTY_FILTER = ApiError(400, 10139, "consumer filter in FilterSubjects cannot be empty")
CONSUMER_OVERLAPPING_FILTERS = ApiError(400, 10138, "consumer subject filters cannot overlap")
CONSUMER_MAX_DELIVER_BACKOFF = ApiError(
    400, 10116, "max deliver is required to be > length of backoff values"
)
CONSUMER_PUSH_MAX_WAITING = ApiError(400, 10080, "consumer in push mode can not set max waiting")
CONSUMER_DIRECT_REQUIRES_PUSH = ApiError(400, 10090, "consumer direct requires a push based consumer")
PRIORITY_POLICY_WITHOUT_GROUP = ApiError(
    400, 10159, "Setting PriorityPolicy requires at least one PriorityGroup to be set"
)
PRIORITY_GROUP_EMPTY_NAME = ApiError(400, 10161, "Group name cannot be an empty string")
PRIORITY_GROUPS_WITH_PUSH = ApiError(400, 10178, "priority groups can not be used with push consumers")
PRIORITY_GROUPS_WITH_POLICY_NONE = ApiError(
    400, 10196, "consumer can not have priority groups when policy is none"
)
PRIORITY_TIMEOUT_WITH_POLICY_NONE = ApiError(
    400, 10197, "PinnedTTL cannot be set when PriorityPolicy is none"
)
PRIORITY_GROUP_NOT_FOUND = ApiError(400, 10160, "Provided priority group does not exist for this consumer")
INVALID_GROUP_NAME = ApiError(
    400, 10162, "Valid priority group name must match A-Z, a-z, 0-9, -_/=)+ and may not exceed 16 characters"
)
CONSUMER_NAME_PATH_SEPARATORS = ApiError(400, 10127, "Consumer name can not contain path separators")
CONSUMER_BACKOFF_NEGATIVE = ApiError(400, 10184, "consumer backoff needs to be positive")
CONSUMER_DESCRIPTION_TOO_LONG = ApiError(
    400, 10107, "consumer description is too long, maximum allowed is 4096"
)
CONSUMER_MAX_PENDING_NEEDS_ACKS = ApiError(400, 10082, "consumer requires ack policy for max ack pending")
CONSUMER_SMALL_HEARTBEAT = ApiError(400, 10083, "consumer idle heartbeat needs to be >= 100ms")
CONSUMER_INVALID_SAMPLING = ApiError(400, 10095, "failed to parse consumer sampling configuration: {err}")
CONSUMER_METADATA_TOO_LONG = ApiError(400, 10135, "consumer metadata exceeds maximum size of 128KB")
CONSUMER_DELIVER_CYCLE = ApiError(400, 10081, "consumer deliver subject forms a cycle")
CONSUMER_INVALID_DELIVER_SUBJECT = ApiError(400, 10112, "invalid push consumer deliver subject")
ACK_FC_REQUIRES_PUSH = ApiError(400, 10218, "flow control ack policy requires a push based consumer")
ACK_FC_REQUIRES_FC = ApiError(400, 10219, "flow control ack policy requires flow control")
ACK_FC_REQUIRES_MAX_ACK_PENDING = ApiError(400, 10220, "flow control ack policy requires max ack pending")
ACK_FC_REQUIRES_NO_ACK_WAIT = ApiError(400, 10221, "flow control ack policy requires unset ack wait")
ACK_FC_REQUIRES_NO_MAX_DELIVER = ApiError(400, 10222, "flow control ack policy requires unset max deliver")
CONSUMER_HEARTBEAT_REQUIRES_PUSH = ApiError(
    400, 10088, "consumer idle heartbeat requires a push based consumer"
)
CONSUMER_FLOW_CONTROL_REQUIRES_PUSH = ApiError(
    400, 10089, "consumer flow control requires a push based consumer"
)
CONSUMER_FLOW_CONTROL_NEEDS_HEARTBEATS = ApiError(
    400, 10108, "consumer with flow control also needs heartbeats"
)
CONSUMER_PULL_RATE_LIMIT = ApiError(400, 10086, "consumer in pull mode can not have rate limit set")
CONSUMER_DELIVER_WILDCARDS = ApiError(400, 10079, "consumer deliver subject has wildcards")
CONSUMER_MAX_EXPIRES_TOO_SMALL = ApiError(400, 10115, "consumer max request expires needs to be >= 1ms")
CONSUMER_ACK_WAIT_NEGATIVE = ApiError(400, 10183, "consumer ack wait needs to be positive")
CONSUMER_INVALID_SUBJECT = ApiError(500, 10052, "invalid subject")
MAXIMUM_CONSUMERS_LIMIT = ApiError(400, 10026, "maximum consumers limit reached")
CONSUMER_DURABLE_NAME_NOT_SET = ApiError(
    400, 10018, "consumer expected to be durable but a durable name was not set"
)
STREAM_NAME_PATH_SEPARATORS = ApiError(400, 10128, "Stream name can not contain path separators")
STREAM_NAME_EXIST_RESTORE_FAILED = ApiError(400, 10130, "stream name already in use, cannot restore")
STREAM_SNAPSHOT_FAILED = ApiError(500, 10064, "snapshot failed: {err}")
STREAM_RESTORE_FAILED = ApiError(500, 10062, "restore failed: {err}")
SNAPSHOT_DELIVER_SUBJECT_INVALID = ApiError(400, 10015, "deliver subject not valid")
#: More replicas than live gateways (jetlake's "cluster" is its gateways, docs/compatibility.md).
NO_SUITABLE_PEERS = ApiError(400, 10005, "no suitable peers for placement")
CONSUMER_REPLICAS_EXCEED_STREAM = ApiError(400, 10126, "consumer config replica count exceeds parent stream")
#: The most replicas a stream may ask for (``StreamMaxReplicas``).
MAX_REPLICAS = 5
REPLICAS_NEGATIVE = ApiError(400, 10133, "replicas count cannot be negative")
PEDANTIC = ApiError(400, 10157, "pedantic mode: {err}")
MIRROR_WITH_SUBJECTS = ApiError(400, 10034, "stream mirrors can not contain subjects")

# Publish answers (the error sits in a PubAck with the stream name and sequence 0).
STREAM_SEALED = ApiError(400, 10109, "invalid operation on sealed stream")
STREAM_NOT_MATCH = ApiError(400, 10060, "expected stream does not match")
STREAM_WRONG_LAST_SEQUENCE = ApiError(400, 10071, "wrong last sequence: {seq}")
STREAM_WRONG_LAST_SEQUENCE_CONSTANT = ApiError(400, 10164, "wrong last sequence")
STREAM_WRONG_LAST_MSG_ID = ApiError(400, 10070, "wrong last msg ID: {id}")
STREAM_EXPECTED_LAST_SEQ_PER_SUBJECT_INVALID = ApiError(
    400, 10193, "missing sequence for expected last sequence per subject"
)
STREAM_MESSAGE_EXCEEDS_MAXIMUM = ApiError(400, 10054, "message size exceeds maximum allowed")
STREAM_HEADER_EXCEEDS_MAXIMUM = ApiError(400, 10097, "header size exceeds maximum allowed of 64k")
STREAM_ROLLUP_FAILED = ApiError(500, 10111, "{err}")
MESSAGE_TTL_INVALID = ApiError(400, 10165, "invalid per-message TTL")
MESSAGE_TTL_DISABLED = ApiError(400, 10166, "per-message TTL is disabled")
MESSAGE_INCR_DISABLED = ApiError(400, 10168, "message counters is disabled")
MESSAGE_INCR_INVALID = ApiError(400, 10171, "message counter increment is invalid")
MESSAGE_SCHEDULES_DISABLED = ApiError(400, 10188, "message schedules is disabled")
MESSAGE_SCHEDULES_SCHEDULER_INVALID = ApiError(400, 10212, "message schedules invalid scheduler")
MESSAGE_SOURCE_HEADER_NOT_ALLOWED = ApiError(400, 10227, "message stream source header is not allowed")
ATOMIC_PUBLISH_DISABLED = ApiError(400, 10174, "atomic publish is disabled")
ATOMIC_PUBLISH_MISSING_SEQ = ApiError(400, 10175, "atomic publish sequence is missing")
ATOMIC_PUBLISH_INCOMPLETE = ApiError(400, 10176, "atomic publish batch is incomplete")
ATOMIC_PUBLISH_UNSUPPORTED_HEADER = ApiError(400, 10177, "atomic publish unsupported header used: {header}")
ATOMIC_PUBLISH_INVALID_ID = ApiError(400, 10179, "atomic publish batch ID is invalid")
ATOMIC_PUBLISH_TOO_LARGE = ApiError(400, 10199, "atomic publish batch is too large: {size}")
ATOMIC_PUBLISH_INVALID_COMMIT = ApiError(400, 10200, "atomic publish batch commit is invalid")
ATOMIC_PUBLISH_DUPLICATE_ID = ApiError(400, 10201, "atomic publish batch contains duplicate message id")
ATOMIC_PUBLISH_TOO_MANY_INFLIGHT = ApiError(429, 10210, "atomic publish too many inflight")
MIRROR_WITH_ATOMIC_PUBLISH = ApiError(400, 10198, "stream mirrors can not also use atomic publishing")
MIRROR_WITH_FIRST_SEQ = ApiError(400, 10143, "stream mirrors can not have first sequence configured")
MIRROR_WITH_SOURCES = ApiError(400, 10031, "stream mirrors can not also contain other sources")
MIRROR_WITH_COUNTERS = ApiError(400, 10173, "stream mirrors can not also calculate counters")
MIRROR_WITH_MSG_SCHEDULES = ApiError(400, 10186, "stream mirrors can not also schedule messages")
MIRROR_WITH_BATCH_PUBLISH = ApiError(400, 10209, "stream mirrors can not also use batch publishing")
BATCH_PUBLISH_DISABLED = ApiError(400, 10205, "batch publish is disabled")
BATCH_PUBLISH_INVALID_PATTERN = ApiError(400, 10206, "batch publish pattern is invalid")
BATCH_PUBLISH_INVALID_ID = ApiError(400, 10207, "batch publish ID is invalid")
BATCH_PUBLISH_UNKNOWN_ID = ApiError(400, 10208, "batch publish ID unknown")
BATCH_PUBLISH_TOO_MANY_INFLIGHT = ApiError(429, 10211, "batch publish too many inflight")
MIRROR_INVALID_STREAM_NAME = ApiError(400, 10142, "mirrored stream name is invalid")
MIRROR_MULTIPLE_FILTERS = ApiError(
    400, 10150, "mirror with multiple subject transforms cannot also have a single subject filter"
)
MIRROR_INVALID_FILTER = ApiError(400, 10151, "mirror transform source: {err}")
MIRROR_OVERLAPPING_FILTERS = ApiError(400, 10152, "mirror subject filters can not overlap")
MIRROR_INVALID_TRANSFORM = ApiError(400, 10154, "mirror transform: {err}")
MIRROR_MAX_MESSAGE_SIZE_TOO_BIG = ApiError(400, 10030, "stream mirror must have max message size >= source")
SOURCE_MAX_MESSAGE_SIZE_TOO_BIG = ApiError(400, 10046, "stream source must have max message size >= target")
SOURCE_DUPLICATE = ApiError(400, 10140, "duplicate source configuration detected")
SOURCE_INVALID_STREAM_NAME = ApiError(400, 10141, "sourced stream name is invalid")
SOURCE_MULTIPLE_FILTERS = ApiError(
    400, 10144, "source with multiple subject transforms cannot also have a single subject filter"
)
SOURCE_INVALID_FILTER = ApiError(400, 10145, "source transform source: {err}")
SOURCE_INVALID_TRANSFORM = ApiError(400, 10146, "source transform: {err}")
SOURCE_OVERLAPPING_FILTERS = ApiError(400, 10147, "source filters can not overlap")
STREAM_EXTERNAL_API_OVERLAP = ApiError(
    400, 10021, "stream external api prefix {prefix} must not overlap with {subject}"
)
STREAM_EXTERNAL_DELIVERY_PREFIX_OVERLAPS = ApiError(
    400, 10022, "stream external delivery prefix {prefix} overlaps with stream subject {subject}"
)
STREAM_INVALID_EXTERNAL_DELIVERY_SUBJECT = ApiError(
    400, 10024, "stream external delivery prefix {prefix} must not contain wildcards"
)
SOURCE_WITH_MSG_SCHEDULES = ApiError(400, 10187, "stream source can not also schedule messages")
BAD_REQUEST = ApiError(400, 10003, "bad request")
NO_MESSAGE_FOUND = ApiError(404, 10037, "no message found")
SEQUENCE_NOT_FOUND = ApiError(400, 10043, "sequence {seq} not found")
STREAM_MSG_DELETE_FAILED = ApiError(500, 10057, "{err}")
STREAM_PURGE_NOT_PERMITTED = ApiError(500, 10110, "stream purge not permitted")
CONSUMER_WQ_PULL_EXPLICIT = ApiError(
    400, 10084, "consumer in pull mode requires explicit ack policy on workqueue stream"
)
CONSUMER_WQ_EXPLICIT = ApiError(400, 10098, "workqueue stream requires explicit ack")
CONSUMER_WQ_DELIVER_ALL = ApiError(400, 10101, "consumer must be deliver all on workqueue stream")
CONSUMER_WQ_MULTIPLE_UNFILTERED = ApiError(
    400, 10099, "multiple non-filtered consumers not allowed on workqueue stream"
)
CONSUMER_WQ_NOT_UNIQUE = ApiError(400, 10100, "filtered consumer not unique on workqueue stream")
CONSUMER_MAX_ACK_PENDING_LIMIT = ApiError(
    400, 10121, "consumer max ack pending exceeds system limit of {limit}"
)
CONSUMER_INACTIVE_THRESHOLD_LIMIT = ApiError(
    400, 10153, "consumer inactive threshold exceeds system limit of {limit}"
)
