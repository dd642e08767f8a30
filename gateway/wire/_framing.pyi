"""Types of the compiled hot path: the same as its Python reference, ``gateway.wire.framing``."""

from collections.abc import Sequence

from gateway.wire.frames import Frame
from gateway.wire.framing import DeliveredLike, StoredLike

class FrameParser:
    def __init__(self, ack_runs: bool = False) -> None: ...
    def feed(self, data: bytes) -> list[Frame]: ...

def delivery_frames(
    inbox: str,
    stream: str,
    consumer: str,
    queues: tuple[str, ...],
    run: Sequence[tuple[StoredLike, DeliveredLike]],
    headers_only: bool = False,
    pin: str | None = None,
) -> tuple[bytes, int]: ...
def encode_msgs(frames: list[tuple[str, bytes]]) -> bytes: ...
