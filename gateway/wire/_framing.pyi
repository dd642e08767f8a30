"""Types of the compiled hot path: those of its Python reference, ``gateway.wire.framing``, which
it implements name for name (one signature to keep, not two)."""

from gateway.wire.framing import FrameParser as FrameParser
from gateway.wire.framing import delivery_frames as delivery_frames
from gateway.wire.framing import encode_msgs as encode_msgs
