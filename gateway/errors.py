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
STREAM_NOT_FOUND = ApiError(404, 10059, "stream not found")
STREAM_NAME_EXISTS = ApiError(400, 10058, "stream name already in use with a different configuration")
STREAM_MISMATCH = ApiError(400, 10056, "stream name in subject does not match request")
STREAM_SUBJECT_OVERLAP = ApiError(400, 10065, "subjects overlap with an existing stream")
STREAM_INVALID_CONFIG = ApiError(500, 10052, "{err}")
STREAM_STORE_FAILED = ApiError(503, 10077, "{err}")
CONSUMER_NOT_FOUND = ApiError(404, 10014, "consumer not found")
CONSUMER_ALREADY_EXISTS = ApiError(400, 10148, "consumer already exists")
CONSUMER_DURABLE_NAME_NOT_MATCH_SUBJECT = ApiError(
    400, 10017, "consumer name in subject does not match durable name in request"
)
CONSUMER_CREATE = ApiError(500, 10012, "{err}")
CONSUMER_FILTER_NOT_MATCH_SUBJECT = ApiError(
    400, 10131, "Consumer create request did not match filtered subject from create subject"
)
BAD_REQUEST = ApiError(400, 10003, "bad request")
NO_MESSAGE_FOUND = ApiError(404, 10037, "no message found")
SEQUENCE_NOT_FOUND = ApiError(400, 10043, "sequence {seq} not found")
STREAM_MSG_DELETE_FAILED = ApiError(500, 10057, "{err}")
STREAM_SEALED = ApiError(400, 10109, "invalid operation on sealed stream")
STREAM_PURGE_NOT_PERMITTED = ApiError(500, 10110, "stream purge not permitted")
STREAM_REPLICAS_NOT_SUPPORTED = ApiError(500, 10074, "replicas > 1 not supported in non-clustered mode")
