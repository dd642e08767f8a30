"""The HTTP monitor: probes, the token, ``/jsz`` against nats-server's own ``/jsz`` and the API, and
``/metrics`` parsed by prometheus_client's parser with numbers checked against the API."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import pytest

from gateway.monitor.jsz import stored_config
from spark_jobs.cli import run_job
from spark_jobs.settings import JobSettings
from storage_delta.commit.store import StoreRoot
from storage_delta.format.integrity import DamagedFile
from storage_delta.tables.catalog import CatalogTable
from storage_delta.tables.jobruns import ERROR_CHARS, JobRun, RunFigures, job_figures, record_run
from storage_delta.tables.removals import Removal, RemovalLog
from tests.harness import ReferenceJetStream, scrub, stop
from tests.monitor_fixtures import (
    TOKEN,
    MonitoredJetlake,
    ack_floor_scenario,
    api,
    get_json,
    http_get,
    monitor_url,
    samples,
)

CONSUMER_NUMBERS = ("num_ack_pending", "num_redelivered", "num_waiting", "num_pending")


def without_last_active(seqs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in seqs.items() if k != "last_active"}


async def test_token_guards_data_not_probes(monitored: MonitoredJetlake) -> None:
    """With monitor_token set, /jsz, /metrics, /history and /lake need the bearer token; probes and
    the page do not."""
    base = monitor_url(monitored)
    for path in ("/jsz", "/metrics", "/history", "/lake"):
        for token in (None, "wrong-token"):
            status, body = http_get(base + path, token)
            assert status == 401, (path, token, body)
        status, _ = http_get(base + path, TOKEN)
        assert status == 200
    for path in ("/healthz", "/readyz", "/", "/openapi.json"):
        status, _ = http_get(base + path, None)
        assert status == 200, path


async def test_jsz_matches_nats_server_and_the_api(
    monitored: MonitoredJetlake, monitored_reference: ReferenceJetStream, unique: str
) -> None:
    """/jsz has nats-server's shape, the same stream and consumer numbers as the real server's /jsz,
    and on each server the numbers of its own STREAM.INFO and CONSUMER.INFO answers."""
    seen: dict[str, Any] = {}
    for name, target in (("jetstream", monitored_reference), ("jetlake", monitored)):
        nc = await nats.connect(target.url)
        try:
            await ack_floor_scenario(nc, unique)
            jsz = get_json(monitor_url(target) + "/jsz?consumers=true&config=true")
            info = await api(nc, f"STREAM.INFO.{unique}")
            cinfo = {c: await api(nc, f"CONSUMER.INFO.{unique}.{c}") for c in ("fast", "slow")}
        finally:
            await nc.close()
        (account,) = jsz["account_details"]
        (detail,) = [s for s in account["stream_detail"] if s["name"] == unique]
        # the numbers are the API's
        assert detail["state"] == info["state"]
        assert detail["config"] == stored_config(info["config"])
        assert detail["created"] == info["created"]
        consumers = {c["name"]: c for c in detail["consumer_detail"]}
        assert sorted(consumers) == ["fast", "slow"]
        for cname, c in consumers.items():
            api_c = cinfo[cname]
            assert c["delivered"] == api_c["delivered"]
            assert c["ack_floor"] == api_c["ack_floor"]
            assert c["config"] == stored_config(api_c["config"])
            assert {k: c[k] for k in CONSUMER_NUMBERS} == {k: api_c[k] for k in CONSUMER_NUMBERS}
        # the totals add up
        assert jsz["streams"] == len(account["stream_detail"])
        assert jsz["messages"] == sum(s["state"]["messages"] for s in account["stream_detail"])
        assert jsz["bytes"] == jsz["storage"] == sum(s["state"]["bytes"] for s in account["stream_detail"])
        assert jsz["consumers"] == sum(len(s["consumer_detail"]) for s in account["stream_detail"])
        seen[name] = {"jsz": jsz, "account": account, "detail": detail, "consumers": consumers}

    ref, ours = seen["jetstream"], seen["jetlake"]
    # the same shape: field names at every level
    assert set(ours["jsz"]) == set(ref["jsz"])
    assert set(ours["account"]) == set(ref["account"])
    assert set(ours["detail"]) == set(ref["detail"])
    for cname in ("fast", "slow"):
        assert set(ours["consumers"][cname]) == set(ref["consumers"][cname])
    # and the same configs and numbers as the real JetStream
    assert ours["detail"]["config"] == ref["detail"]["config"]
    assert scrub(ours["detail"]["state"]) == scrub(ref["detail"]["state"])
    for cname in ("fast", "slow"):
        o, r = ours["consumers"][cname], ref["consumers"][cname]
        assert without_last_active(o["delivered"]) == without_last_active(r["delivered"])
        assert without_last_active(o["ack_floor"]) == without_last_active(r["ack_floor"])
        assert {k: o[k] for k in CONSUMER_NUMBERS} == {k: r[k] for k in CONSUMER_NUMBERS}
    assert ours["consumers"]["slow"]["num_redelivered"] == 1


async def test_metrics_parse_and_match_the_api(monitored: MonitoredJetlake, unique: str) -> None:
    """/metrics parses as Prometheus text; its counters move by what was done, its gauges equal the
    API's stream and consumer info, and lag is the stream's last sequence minus the ack floor."""
    url = monitor_url(monitored) + "/metrics"
    status, body = http_get(url)
    assert status == 200
    before = samples(body.decode())
    nc = await nats.connect(monitored.url)
    try:
        await ack_floor_scenario(nc, unique)
        status, body = http_get(url)
        account = await api(nc, "INFO")
        info = await api(nc, f"STREAM.INFO.{unique}")
        cinfo = {c: await api(nc, f"CONSUMER.INFO.{unique}.{c}") for c in ("fast", "slow")}
    finally:
        await nc.close()
    assert status == 200
    after = samples(body.decode())

    def delta(name: str) -> float:
        key: tuple[str, frozenset[tuple[str, str]]] = (name, frozenset())
        return after[key] - before.get(key, 0.0)

    # counters: ten publishes, stored in as many messages over some commits
    assert delta("jetlake_publish_received_total") == 10
    assert delta("jetlake_messages_committed_total") == 10
    assert delta("jetlake_messages_refused_total") == 0
    assert delta("jetlake_commit_batch_messages_sum") == 10
    assert delta("jetlake_commits_total") == delta("jetlake_commit_seconds_count") >= 1
    assert delta("jetlake_commit_batch_messages_count") == delta("jetlake_commits_total")
    # the ack log recorded at least the two creates, the four + one acks and the NAK
    assert delta("jetlake_acklog_rows_committed_total") >= 8
    assert delta("jetlake_acklog_commits_total") >= 1
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for (name, labels), v in after.items()
        if name == "jetlake_commit_seconds_bucket"
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert buckets[-1][1] == after[("jetlake_commit_seconds_count", frozenset())]
    assert after[("jetlake_api_requests_total", frozenset())] == account["api"]["total"]
    assert after[("jetlake_api_errors_total", frozenset())] == account["api"]["errors"]
    assert after[("jetlake_storage_bytes", frozenset())] == account["storage"]
    assert after[("jetlake_leaf_connected", frozenset())] == 1

    # gauges: the API's numbers
    s = frozenset({("stream", unique)})
    state = info["state"]
    for metric, key in (
        ("messages", "messages"),
        ("bytes", "bytes"),
        ("first_seq", "first_seq"),
        ("last_seq", "last_seq"),
        ("consumers", "consumer_count"),
    ):
        assert after[(f"jetlake_stream_{metric}", s)] == state[key], metric
    for cname, ci in cinfo.items():
        labels = frozenset({("stream", unique), ("consumer", cname)})
        got = {k: after[(f"jetlake_consumer_{k}", labels)] for k in CONSUMER_NUMBERS}
        assert got == {k: ci[k] for k in CONSUMER_NUMBERS}
        assert after[("jetlake_consumer_ack_floor_stream_seq", labels)] == ci["ack_floor"]["stream_seq"]
        assert after[("jetlake_consumer_ack_floor_consumer_seq", labels)] == ci["ack_floor"]["consumer_seq"]
        assert after[("jetlake_consumer_delivered_stream_seq", labels)] == ci["delivered"]["stream_seq"]
        lag = state["last_seq"] - ci["ack_floor"]["stream_seq"]
        assert after[("jetlake_consumer_lag", labels)] == lag
    assert after[("jetlake_consumer_lag", frozenset({("stream", unique), ("consumer", "fast")}))] == 6


async def test_metrics_report_the_job_runs(monitored: MonitoredJetlake) -> None:
    """Job runs recorded in the store's ``jobruns`` table (as ``jetlake jobs`` records them, from
    its own process) show in /metrics: runs, the newest run's time, rows removed, per job."""
    url = monitor_url(monitored) + "/metrics"
    before = samples(http_get(url)[1].decode())
    root = StoreRoot(str(monitored.data_root))
    t0 = 1_800_000_000_000_000_000
    for job, started, removed in (
        ("retention", t0, 5),
        ("retention", t0 + 2_000_000_000, 7),
        ("seal", t0, 0),
    ):
        await asyncio.to_thread(record_run, root, JobRun(job, started, 0.5, RunFigures(rows_removed=removed)))
    after = samples(http_get(url)[1].decode())

    def delta(name: str, job: str) -> float:
        key = (name, frozenset({("job", job)}))
        return after[key] - before.get(key, 0.0)

    assert delta("jetlake_job_runs_total", "retention") == 2
    assert delta("jetlake_job_runs_total", "seal") == 1
    assert delta("jetlake_job_rows_removed_total", "retention") == 12
    assert delta("jetlake_job_rows_removed_total", "seal") == 0
    retention_last = after[("jetlake_job_last_run_timestamp_seconds", frozenset({("job", "retention")}))]
    assert retention_last == (t0 + 2_000_000_000) / 1e9


def test_a_failed_job_run_is_recorded_with_its_error(tmp_path: Path) -> None:
    """``jetlake jobs run`` records a run that fails, with the error's words, in ``jobfailures`` and
    raises the error again: here the removals job over a removal log whose file lost its tail."""
    root = StoreRoot(str(tmp_path))
    CatalogTable(root).put("stream", "S", "S", {"created": 1})
    RemovalLog(root).append([Removal("S", 1, 1, 5)])
    RemovalLog(root).append([Removal("S", 1, 9, 9)])
    data = sorted((tmp_path / "removals").glob("*.parquet"))[0]
    data.write_bytes(data.read_bytes()[:-20])
    with pytest.raises(DamagedFile, match="see jetlake repair") as raised:
        run_job(None, "removals", JobSettings(data_root=root.uri))
    figures = job_figures(root)["removals"]
    assert (figures.runs, figures.failures) == (1, 1)
    assert figures.last.error == f"{type(raised.value).__name__}: {raised.value}"[:ERROR_CHARS]


async def test_a_failing_job_shows_in_metrics_and_lake(monitored: MonitoredJetlake) -> None:
    """A job whose newest run failed: /metrics counts the failure and flags the newest run, /lake
    carries its error and a warning that says what to do; a later good run clears the flag."""
    url = monitor_url(monitored)
    root = StoreRoot(str(monitored.data_root))
    t0 = 1_900_000_000_000_000_000
    await asyncio.to_thread(record_run, root, JobRun("seal", t0, 0.2, error="OSError: disk full"))
    after = samples(http_get(url + "/metrics")[1].decode())
    seal = frozenset({("job", "seal")})
    assert after[("jetlake_job_failures_total", seal)] >= 1
    assert after[("jetlake_job_last_run_failed", seal)] == 1
    lake = get_json(url + "/lake", TOKEN)
    assert lake["jobs"]["seal"]["last"]["error"] == "OSError: disk full"
    assert any(
        w["stream"] is None
        and w["text"].startswith("the last run of the seal job")
        and "disk full" in w["text"]
        for w in lake["warnings"]
    )
    await asyncio.to_thread(record_run, root, JobRun("seal", t0 + 10**9, 0.2))
    again = samples(http_get(url + "/metrics")[1].decode())
    assert again[("jetlake_job_last_run_failed", seal)] == 0
    assert not any("seal job" in w["text"] for w in get_json(url + "/lake", TOKEN)["warnings"])


async def test_openapi_describes_the_endpoints(monitored: MonitoredJetlake) -> None:
    """The monitor documents itself (OpenAPI at /openapi.json, Swagger UI at /docs)."""
    schema = get_json(monitor_url(monitored) + "/openapi.json", None)
    assert {"/healthz", "/readyz", "/jsz", "/metrics", "/history", "/lake"} <= set(schema["paths"])
    assert {p["name"] for p in schema["paths"]["/jsz"]["get"]["parameters"]} == {
        "accounts",
        "streams",
        "consumers",
        "config",
    }
    status, body = http_get(monitor_url(monitored) + "/docs", None)
    assert status == 200
    assert b"swagger" in body.lower()


async def wait_ready(url: str, ready: bool, within_s: float = 30.0) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        status, body = http_get(url, None)
        answer = json.loads(body)
        if (status == 200) == ready:
            return dict(answer)
        assert asyncio.get_running_loop().time() < deadline, answer
        await asyncio.sleep(0.2)


async def test_readiness_follows_the_leaf_link(monitored: MonitoredJetlake) -> None:
    """/readyz is 503 while nats-server is down (the leaf link is gone) and 200 once it is back;
    /healthz stays 200 throughout (the gateway itself is alive)."""
    url = monitor_url(monitored) + "/readyz"
    up = await wait_ready(url, True)
    assert up == {"status": "ready", "leaf_connected": True, "store_open": True}
    stop(monitored.server)
    down = await wait_ready(url, False)
    assert down == {"status": "unavailable", "leaf_connected": False, "store_open": True}
    assert http_get(monitor_url(monitored) + "/healthz", None) == (200, b'{"status":"ok"}')
    monitored.start_server()
    assert (await wait_ready(url, True))["leaf_connected"] is True


def detail_keys(jsz: dict[str, Any], stream: str) -> dict[str, Any]:
    """The field names /jsz shows at each level for one stream (and its first consumer)."""
    accounts = jsz.get("account_details")
    if accounts is None:
        return {"top": sorted(jsz)}
    (account,) = accounts
    if "stream_detail" not in account:
        return {"top": sorted(jsz), "account": sorted(account)}
    (detail,) = [s for s in account["stream_detail"] if s["name"] == stream]
    out = {"top": sorted(jsz), "account": sorted(account), "stream": sorted(detail)}
    if "consumer_detail" in detail:
        out["consumer"] = sorted(detail["consumer_detail"][0])
    return out


@pytest.mark.parametrize(
    "query",
    [
        "",  # totals only
        "?accounts=true",  # the account, no streams
        "?streams=true",  # streams with state, no config
        "?consumers=true",  # consumers imply streams
        "?streams=true&config=true",  # configs of streams
        "?consumers=true&config=true",  # and of consumers
    ],
)
async def test_jsz_options_shape_like_nats_server(
    monitored: MonitoredJetlake, monitored_reference: ReferenceJetStream, unique: str, query: str
) -> None:
    """Each /jsz option includes the same levels and fields on jetlake as on nats-server."""
    shapes = {}
    for name, target in (("jetstream", monitored_reference), ("jetlake", monitored)):
        nc = await nats.connect(target.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name=unique, subjects=[f"{unique.lower()}.>"])
            await js.publish(f"{unique.lower()}.x", b"x")
            await js.add_consumer(unique, durable_name="c", ack_policy="explicit")
        finally:
            await nc.close()
        shapes[name] = detail_keys(get_json(monitor_url(target) + "/jsz" + query), unique)
    assert shapes["jetlake"] == shapes["jetstream"]
