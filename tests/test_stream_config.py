"""StreamConfig defaults and validation, table-driven: each request goes to STREAM.CREATE on the real
JetStream and on jetlake, and the whole answers (config with defaults, or error with code, err_code
and description) must be equal. ``{n}`` is a stream name and ``{p}`` a subject prefix unique to the
case."""

from __future__ import annotations

import json
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from tests.differential import assert_same

S = 1_000_000_000

CASES: list[tuple[str, Any]] = [
    # defaults: subjects [name], limits -1, file storage, 2 min duplicate window, metadata levels
    ("defaults", {"name": "{n}"}),
    ("name_with_star", {"name": "{n}*"}),
    ("name_with_gt", {"name": "{n}>"}),
    ("name_with_slash", {"name": "{n}/x"}),
    ("name_with_backslash", {"name": "{n}\\x"}),
    ("name_too_long", {"name": "{n}" + "N" * 260}),
    ("description", {"name": "{n}", "description": "hello"}),
    ("empty_description_omitted", {"name": "{n}", "description": ""}),
    ("description_too_long", {"name": "{n}", "description": "d" * 4097}),
    ("subjects_overlap_each_other", {"name": "{n}", "subjects": ["{p}.>", "{p}.b"]}),
    ("subjects_star_overlap", {"name": "{n}", "subjects": ["{p}.*", "{p}.b"]}),
    ("subjects_duplicate", {"name": "{n}", "subjects": ["{p}", "{p}"]}),
    ("subject_empty_token", {"name": "{n}", "subjects": ["{p}..b"]}),
    ("subject_gt_not_last", {"name": "{n}", "subjects": ["{p}.>.b"]}),
    ("subject_empty", {"name": "{n}", "subjects": [""]}),
    ("subject_space", {"name": "{n}", "subjects": ["{p} b"]}),
    ("subjects_js_api", {"name": "{n}", "subjects": ["$JS.API.>"]}),
    ("subjects_js_ack", {"name": "{n}", "subjects": ["$JS.ACK.{p}.>"]}),
    ("subjects_jsc", {"name": "{n}", "subjects": ["$JSC.>"]}),
    ("subjects_nrg", {"name": "{n}", "subjects": ["$NRG.{p}"]}),
    ("subjects_sys", {"name": "{n}", "subjects": ["$SYS.>"]}),
    ("subjects_star_gt", {"name": "{n}", "subjects": ["*.>"]}),
    ("subjects_everything", {"name": "{n}", "subjects": [">"]}),
    ("subjects_js_event_allowed", {"name": "{n}", "subjects": ["$JS.EVENT.{p}.>"]}),
    ("subjects_kv_allowed", {"name": "{n}", "subjects": ["$KV.{p}.>"]}),
    ("subjects_null_means_name", {"name": "{n}", "subjects": None}),
    ("subjects_not_a_list", {"name": "{n}", "subjects": "{p}"}),
    ("subjects_number_item", {"name": "{n}", "subjects": ["{p}", 1]}),
    ("retention_unknown", {"name": "{n}", "retention": "foo"}),
    ("retention_wrong_case", {"name": "{n}", "retention": "Limits"}),
    ("retention_workqueue", {"name": "{n}", "retention": "workqueue"}),
    ("retention_interest", {"name": "{n}", "retention": "interest"}),
    ("storage_unknown", {"name": "{n}", "storage": "File"}),
    ("storage_memory", {"name": "{n}", "storage": "memory"}),
    ("discard_unknown", {"name": "{n}", "discard": "foo"}),
    ("discard_any_case", {"name": "{n}", "discard": "New"}),
    ("limits_below_minus_one", {"name": "{n}", "max_consumers": -2, "max_msgs": -2, "max_bytes": -5}),
    ("limits_zero", {"name": "{n}", "max_msgs_per_subject": 0, "max_msg_size": 0, "max_consumers": 0}),
    (
        "limits_set",
        {"name": "{n}", "max_msgs": 10, "max_bytes": 1000, "max_msgs_per_subject": 2, "max_msg_size": 50},
    ),
    ("pedantic_limit", {"name": "{n}", "pedantic": True, "max_msgs": -5}),
    ("max_msgs_string", {"name": "{n}", "max_msgs": "x"}),
    ("max_msgs_fraction", {"name": "{n}", "max_msgs": 1.5}),
    ("max_msg_size_over_int32", {"name": "{n}", "max_msg_size": 3_000_000_000}),
    ("max_age_negative", {"name": "{n}", "max_age": -1}),
    ("max_age_too_small", {"name": "{n}", "max_age": 50_000_000}),
    ("max_age_string", {"name": "{n}", "max_age": "1s"}),
    ("max_age_sets_window", {"name": "{n}", "max_age": 60 * S}),
    ("max_age_smallest", {"name": "{n}", "max_age": 100_000_000}),
    ("pedantic_window_over_age", {"name": "{n}", "pedantic": True, "max_age": 10 * S}),
    ("window_negative", {"name": "{n}", "duplicate_window": -1}),
    ("window_too_small", {"name": "{n}", "duplicate_window": 99_999_999}),
    ("window_smallest", {"name": "{n}", "duplicate_window": 100_000_000}),
    ("window_over_age", {"name": "{n}", "duplicate_window": 600 * S, "max_age": 60 * S}),
    ("discard_new_per_subject_needs_new", {"name": "{n}", "discard_new_per_subject": True}),
    (
        "discard_new_per_subject_needs_limit",
        {"name": "{n}", "discard_new_per_subject": True, "discard": "new"},
    ),
    (
        "discard_new_per_subject",
        {"name": "{n}", "discard_new_per_subject": True, "discard": "new", "max_msgs_per_subject": 5},
    ),
    ("no_ack", {"name": "{n}", "no_ack": True}),
    ("no_ack_string", {"name": "{n}", "no_ack": "yes"}),
    ("rollup_needs_purge", {"name": "{n}", "allow_rollup_hdrs": True, "deny_purge": True}),
    ("flags", {"name": "{n}", "allow_direct": True, "deny_delete": True, "allow_rollup_hdrs": True}),
    ("deny_purge", {"name": "{n}", "deny_purge": True}),
    ("allow_msg_ttl", {"name": "{n}", "allow_msg_ttl": True}),
    (
        "marker_ttl_turns_on_ttl_and_rollup",
        {"name": "{n}", "subject_delete_marker_ttl": S, "deny_purge": True},
    ),
    ("marker_ttl_too_small", {"name": "{n}", "subject_delete_marker_ttl": 100_000_000}),
    ("marker_ttl_negative", {"name": "{n}", "subject_delete_marker_ttl": -1}),
    ("pedantic_marker_ttl", {"name": "{n}", "pedantic": True, "subject_delete_marker_ttl": S}),
    ("sealed_on_create", {"name": "{n}", "sealed": True}),
    ("mirror_direct_without_mirror", {"name": "{n}", "mirror_direct": True}),
    ("metadata_kept", {"name": "{n}", "metadata": {"a": "b", "_nats.foo": "x", "_nats.ver": "0"}}),
    ("metadata_number", {"name": "{n}", "metadata": {"a": 1}}),
    ("replicas_zero", {"name": "{n}", "num_replicas": 0}),  # R > 1: clustered, tests/test_replicas.py
    ("replicas_negative", {"name": "{n}", "num_replicas": -1}),
    ("compression_s2", {"name": "{n}", "compression": "s2"}),
    ("compression_unknown", {"name": "{n}", "compression": "S2"}),
    ("compression_empty", {"name": "{n}", "compression": ""}),
    ("first_seq", {"name": "{n}", "first_seq": 100}),
    ("first_seq_negative", {"name": "{n}", "first_seq": -1}),
    ("mirror_with_subjects", {"name": "{n}", "mirror": {"name": "X"}, "subjects": ["{p}"]}),
    ("mirror_with_first_seq", {"name": "{n}", "mirror": {"name": "X"}, "first_seq": 5}),
    ("mirror_with_marker_ttl", {"name": "{n}", "mirror": {"name": "X"}, "subject_delete_marker_ttl": S}),
    ("placement_echoed", {"name": "{n}", "placement": {"cluster": "c"}}),
    ("placement_not_object", {"name": "{n}", "placement": "c"}),
    ("placement_preferred", {"name": "{n}", "placement": {"preferred": "x"}}),
    # the server's own refusal comes before jetlake's of atomic batches
    ("persist_async_with_atomic", {"name": "{n}", "persist_mode": "async", "allow_atomic": True}),
    ("consumer_limits", {"name": "{n}", "consumer_limits": {"inactive_threshold": S, "max_ack_pending": 10}}),
    ("consumer_limits_unknown_field", {"name": "{n}", "consumer_limits": {"foo": 1}}),
    ("persist_mode_async", {"name": "{n}", "persist_mode": "async"}),
    ("unknown_field", {"name": "{n}", "unknown_field": 1}),
    ("nulls_read_as_absent", {"name": "{n}", "allow_direct": None, "max_msgs": None}),
    ("field_names_in_any_case", {"NAME": "{n}", "Subjects": ["{p}"], "Max_Msgs": 5}),
    ("discard_in_any_case", {"name": "{n}", "discard": "NEW"}),
    ("persist_mode_default", {"name": "{n}", "persist_mode": "default"}),
    ("null_members", {"name": "{n}", "subjects": ["{p}", None], "metadata": {"a": None}}),
    ("name_missing_from_body", {"subjects": ["{p}"]}),
]


def fill(value: Any, n: str, p: str) -> Any:
    if isinstance(value, str):
        return value.replace("{n}", n).replace("{p}", p)
    if isinstance(value, list):
        return [fill(v, n, p) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, n, p) for k, v in value.items()}
    return value


@pytest.mark.parametrize(("label", "body"), CASES, ids=[c[0] for c in CASES])
async def test_stream_create_config(targets: dict[str, str], unique: str, label: str, body: Any) -> None:
    """STREAM.CREATE answers the same: defaults filled in and echoed, or the same error."""

    async def case(nc: Client, name: str) -> Any:
        req = fill(body, name, name.lower())
        subject_name = req.get("name", name)
        msg = await nc.request(f"$JS.API.STREAM.CREATE.{subject_name}", json.dumps(req).encode(), timeout=5)
        return json.loads(msg.data)

    out = await assert_same(targets, case, unique)
    assert out["type"] == "io.nats.jetstream.api.v1.stream_create_response"


# Accepted by nats-server, refused by jetlake (500/10052 naming the feature): jetlake cannot do
# what they ask, and accepting a config it would not honour is worse than saying so.
UNSUPPORTED = [
    (
        "mirror_durable_consumer",
        {"mirror": {"name": "X", "consumer": {"name": "C", "deliver_subject": "d.x"}}},
    ),
    (
        "sources_durable_consumer",
        {"sources": [{"name": "X", "consumer": {"name": "C", "deliver_subject": "d.x"}}]},
    ),
    ("allow_msg_counter", {"allow_msg_counter": True}),
    ("allow_msg_schedules", {"allow_msg_schedules": True}),
]


@pytest.mark.parametrize(("label", "extra"), UNSUPPORTED, ids=[c[0] for c in UNSUPPORTED])
async def test_unsupported_fields_are_refused(
    targets: dict[str, str], unique: str, label: str, extra: dict[str, Any]
) -> None:
    """The real server accepts these; jetlake answers 500/10052 and creates nothing."""
    answers = {}
    for target, url in targets.items():
        nc = await nats.connect(url)
        try:
            req = fill({"name": unique, **extra}, unique, unique.lower())
            msg = await nc.request(f"$JS.API.STREAM.CREATE.{unique}", json.dumps(req).encode(), timeout=5)
            info = await nc.request(f"$JS.API.STREAM.INFO.{unique}", b"", timeout=5)
            answers[target] = (json.loads(msg.data), json.loads(info.data))
        finally:
            await nc.close()
    created, _ = answers["jetstream"]
    assert "error" not in created
    refused, info = answers["jetlake"]
    assert refused["error"]["code"] == 500
    assert refused["error"]["err_code"] == 10052
    assert "not supported by jetlake" in refused["error"]["description"]
    assert info["error"]["err_code"] == 10059
