"""Push flow control (``flow_control: true``) as a pure state machine.

Like the real server, the gateway asks the subscriber to confirm it keeps up: after about
``WINDOW`` bytes it sends ``100 FlowControl Request`` with reply ``$JS.FC.<stream>.<consumer>.<token>``
(nats clients answer it), and it stops delivering once ``2 × WINDOW`` bytes went out unconfirmed.
A consumer with ``ack_policy: flow_control`` also asks with each idle heartbeat while messages wait
for their ack, and when it reaches ``max_ack_pending``: the answer acks them.
"""

from __future__ import annotations

import secrets
import string

WINDOW = 1 << 20
_CHARS = string.ascii_letters + string.digits


class FlowControl:
    def __init__(self, stream: str, consumer: str) -> None:
        self._prefix = f"$JS.FC.{stream}.{consumer}."
        self._unconfirmed = 0  # bytes since the last answered request
        self.outstanding: str | None = None  # reply subject of the request not answered yet

    def sent(self, size: int) -> str | None:
        """Count a delivery; the reply subject of a flow-control request to send now, if due."""
        self._unconfirmed += size
        return self.request() if self._unconfirmed >= WINDOW else None

    def request(self) -> str | None:
        """The reply subject of a new flow-control request, unless one is outstanding."""
        if self.outstanding is not None:
            return None
        self.outstanding = self._prefix + "".join(secrets.choice(_CHARS) for _ in range(4))
        return self.outstanding

    def stalled(self) -> bool:
        return self.outstanding is not None and self._unconfirmed >= 2 * WINDOW

    def answered(self, subject: str) -> bool:
        """A response on ``subject``; True when it confirms the outstanding request."""
        if subject != self.outstanding:
            return False
        self.outstanding = None
        self._unconfirmed = 0
        return True
