"""The typed configs (gateway/api/configs.py): what the API renders is what the catalog stores, and
reading it back gives the same config; a stored key the model does not know is an error, not lost."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api import consumer_config, stream_config
from gateway.api.configs import ConsumerConfig, StreamConfig, from_json, to_json

STREAMS: list[dict[str, Any]] = [
    {"name": "A"},
    {"name": "B", "subjects": ["b.>"], "max_msgs": 10, "discard": "new", "discard_new_per_subject": True,
     "max_msgs_per_subject": 2, "description": "d", "metadata": {"k": "v"}},
    {"name": "C", "subjects": ["c.*"], "max_age": 5_000_000_000, "allow_msg_ttl": True,
     "subject_delete_marker_ttl": 1_000_000_000, "consumer_limits": {"max_ack_pending": 7}},
    {"name": "D", "subjects": ["d"], "retention": "workqueue", "placement": {"cluster": "x"},
     "first_seq": 42, "no_ack": True, "sealed": False, "allow_direct": True, "compression": "s2"},
]  # fmt: skip
CONSUMERS: list[dict[str, Any]] = [
    {},
    {"durable_name": "d", "ack_policy": "explicit", "backoff": [1_000_000_000, 2_000_000_000],
     "max_deliver": 3, "filter_subjects": ["s.a", "s.b"], "metadata": {"m": "1"}},
    {"name": "p", "deliver_subject": "out", "flow_control": True, "idle_heartbeat": 1_000_000_000,
     "ack_policy": "all", "deliver_group": "g", "headers_only": True},
    {"durable_name": "q", "deliver_policy": "by_start_sequence", "opt_start_seq": 9, "max_batch": 5,
     "max_expires": 2_000_000_000, "max_bytes": 1024, "pause_until": "2030-01-01T00:00:00Z"},
]  # fmt: skip


@pytest.mark.parametrize("request_body", STREAMS)
def test_a_stream_config_reads_back_as_it_was_rendered(request_body: dict[str, Any]) -> None:
    config = stream_config.normalize(request_body, "2.15.1")
    rendered = to_json(config)
    assert from_json(StreamConfig, rendered) == config
    assert list(rendered) == [k for k in StreamConfig.__dataclass_fields__ if k in rendered]  # Go's order


@pytest.mark.parametrize("request_body", CONSUMERS)
def test_a_consumer_config_reads_back_as_it_was_rendered(request_body: dict[str, Any]) -> None:
    stream = stream_config.normalize({"name": "S", "subjects": ["s.>"]}, "2.15.1")
    config = consumer_config.normalize(request_body, "2.15.1", stream)
    assert from_json(ConsumerConfig, to_json(config)) == config


def test_go_omitempty_leaves_out_zero_values_but_keeps_the_rest() -> None:
    rendered = to_json(StreamConfig("S"))
    assert not {"description", "subjects", "first_seq"} & set(rendered)
    assert (rendered["max_msgs"], rendered["sealed"]) == (-1, False)
    assert rendered["consumer_limits"] == {}  # a struct is never left out, its empty fields are
    assert to_json(ConsumerConfig(ack_wait=0, max_deliver=-1))["max_deliver"] == -1


def test_an_unknown_stored_key_is_refused() -> None:
    with pytest.raises(ValueError, match="mirror_of"):
        from_json(StreamConfig, {"name": "S", "mirror_of": "X"})
