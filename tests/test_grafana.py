"""The Grafana dashboard in ``conf/grafana/``: Grafana's provisioning can load it, every PromQL
expression in it parses (promql-parser, the Rust parser Prometheus-compatible stores use), every
jetlake metric it queries is in ``/metrics`` of a real gateway, every nats-server metric it queries
names a field of the real nats-server's ``/varz`` (prometheus-nats-exporter exports ``/varz`` field
``f`` as ``gnatsd_varz_f``), and under publish and consume load the ones that should move do."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import promql_parser
import pytest
import yaml

from storage_delta.commit.store import StoreRoot
from storage_delta.tables.jobruns import JobRun, RunFigures, record_run
from tests.harness import free_port, serving
from tests.monitor_fixtures import MonitoredJetlake, get_json, http_get, load, monitor_url, samples

GRAFANA = Path(__file__).resolve().parent.parent / "conf" / "grafana"
DASHBOARD = GRAFANA / "jetlake.json"
# Grafana's variables, as a query would be sent with them filled in
VARIABLES = {"$__rate_interval": "1m", "$stream": ".*"}
# A histogram's or a counter's samples carry a suffix its family name does not
SUFFIXES = ("_bucket", "_sum", "_count", "_total")

# What the load moves (the test checks it does), and what it leaves alone, with why.
MOVES = {
    "jetlake_stream_stored_messages_total",
    "jetlake_consumer_deliveries_total",
    "jetlake_puback_seconds_bucket",
    "jetlake_commit_seconds_bucket",
    "jetlake_commit_seconds_sum",
    "jetlake_commit_seconds_count",
    "jetlake_commit_batch_messages_sum",
    "jetlake_commit_batch_messages_count",
    "jetlake_consumer_lag",  # the consumer that never acks falls behind
    "jetlake_consumer_num_ack_pending",
    "jetlake_stream_bytes",
    "jetlake_stream_messages",
    "jetlake_lake_table_version",
    "jetlake_lake_stream_bytes",
    "jetlake_lake_stream_files",
    "jetlake_lake_stream_active_block_files",
    "jetlake_lake_stream_unreclaimed_bytes",  # the stream keeps 50 messages of the many it stores
    "jetlake_compaction_rounds_total",
    "jetlake_compaction_files_merged_total",
    "jetlake_index_snapshot_behind_messages",
    "jetlake_api_requests_total",
    "jetlake_job_last_run_timestamp_seconds",  # a job run is recorded meanwhile, as `jetlake jobs` does
    "jetlake_job_last_run_duration_seconds",
}
STEADY = {
    "jetlake_publish_errors_total": "no publish fails",
    "jetlake_messages_refused_total": "the writer is never full",
    "jetlake_api_dropped_total": "the API queue is never full",
    "jetlake_api_errors_total": "no request is wrong",
    "jetlake_consumer_num_pending": "the consumers fetch all there is",
    "jetlake_consumer_num_redelivered": "nothing is redelivered",
    "jetlake_lake_warnings": "nothing needs acting on (tests/test_monitor_lake.py raises warnings)",
    "jetlake_lake_stream_compaction_pending_files": "compaction keeps up",
    "jetlake_lake_stream_unsealed_full_blocks": "no block fills",
    "jetlake_compaction_failed_rounds_total": "no round fails",
    "jetlake_index_snapshot_age_seconds": "a snapshot is written as often as the age is read",
    "jetlake_leaf_connected": "the link stays up",
    "jetlake_leaf_reconnects_total": "the link stays up",
    "jetlake_job_last_run_failed": "the recorded run finished (tests/test_monitor.py records a failed one)",
}
NATS_MOVES = {"gnatsd_varz_in_msgs", "gnatsd_varz_out_msgs"}
NATS_STEADY = {
    "gnatsd_varz_connections": "the clients stay connected",
    "gnatsd_varz_leafnodes": "the gateway's leaf link stays up",
    "gnatsd_varz_slow_consumers": "no client falls behind",
}


class WatchedJetlake(MonitoredJetlake):
    """jetlake whose nats-server has its HTTP monitor on (``/varz``), and whose gateway writes index
    snapshots every 200 ms from 20 new messages (so their metrics exist within a short load)."""

    def __init__(self, workdir: Path) -> None:
        snapshots = {"JETLAKE_INDEX_SNAPSHOT_INTERVAL_MS": "200", "JETLAKE_INDEX_SNAPSHOT_MIN_NEW": "20"}
        super().__init__(workdir, snapshots)
        self.server_monitor_port = free_port()

    def server_conf(self) -> str:
        return super().server_conf() + f"\nhttp_port: {self.server_monitor_port}\n"


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WatchedJetlake]:
    yield from serving(WatchedJetlake(Path(tmp_path_factory.mktemp("watched"))))


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def expressions(dash: dict[str, Any]) -> list[str]:
    """Every PromQL expression: the panels' targets and the query variables'."""
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def metric_names(expr: str) -> set[str]:
    """The metrics an expression selects, parsed with Grafana's variables filled in."""
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    label_values = re.fullmatch(r"label_values\((\w+), *\w+\)", expr)  # a Grafana query, not PromQL
    if label_values:
        expr = label_values.group(1)
    names: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def queried() -> set[str]:
    return set().union(*(metric_names(e) for e in expressions(dashboard())))


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_grafana_can_provision_the_dashboard() -> None:
    """The provisioning files parse and point where the dashboard is; the dashboard has what
    Grafana needs: a uid, panels placed on the grid, each target with a refId and the
    datasource variable, and that variable."""
    (provider,) = yaml.safe_load((GRAFANA / "provisioning/dashboards/jetlake.yaml").read_text())["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"]
    (source,) = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus"
    scrape = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())["scrape_configs"]
    assert {job["job_name"] for job in scrape} == {"jetlake", "nats-server"}
    dash = dashboard()
    assert dash["uid"] == "jetlake"
    assert isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in (panel, *panel["targets"]):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_every_expression_parses_and_every_metric_is_accounted_for() -> None:
    """Each expression is PromQL; each metric it names is jetlake's or nats-server's and is either
    one the load test expects to move or one it explains staying put."""
    exprs = expressions(dashboard())
    assert len(exprs) >= 30
    names = queried()
    jetlake = {n for n in names if n.startswith("jetlake_")}
    nats_server = {n for n in names if n.startswith("gnatsd_varz_")}
    assert names == jetlake | nats_server
    assert jetlake == MOVES | set(STEADY)
    assert nats_server == NATS_MOVES | set(NATS_STEADY)
    with pytest.raises(ValueError, match="unclosed left parenthesis"):
        metric_names("rate(jetlake_commits_total[1m]")  # the parser does refuse what is not PromQL


def sums(text: str) -> dict[str, float]:
    """Each sample name's values summed over its labels (a counter moves iff its sum does)."""
    out: dict[str, float] = {}
    for (name, _), value in samples(text).items():
        out[name] = out.get(name, 0.0) + value
    return out


def varz(target: WatchedJetlake) -> dict[str, Any]:
    return dict(get_json(f"http://127.0.0.1:{target.server_monitor_port}/varz", None))


async def test_the_queried_metrics_exist_and_move_under_load(watched: WatchedJetlake) -> None:
    """Scrape /metrics and nats-server's /varz, then run a publisher and two consumers on a stream
    that keeps 50 messages (and record a job run as ``jetlake jobs`` would) and scrape until every
    metric in MOVES has differed from its first value and every queried one has a sample (30 s at
    most): every queried metric is
    there, and each that should move did."""
    url = monitor_url(watched) + "/metrics"
    nc = await nats.connect(watched.url)
    try:
        await nc.jetstream().add_stream(name="WARMUP", subjects=["warmup"])
        status, body = http_get(url)
        assert status == 200
        before, varz_before = sums(body.decode()), varz(watched)
        moved: set[str] = set()
        wanted = {n for n in queried() if n.startswith("jetlake_")}
        async with load(nc, "GRAFANA", max_msgs=50):
            root = StoreRoot(str(watched.data_root))
            run = JobRun("retention", 1_800_000_000_000_000_000, 1.5, RunFigures())
            await asyncio.to_thread(record_run, root, run)
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                await asyncio.sleep(0.5)
                status, body = http_get(url)
                assert status == 200
                after = sums(body.decode())
                moved |= {n for n in MOVES if after.get(n, 0.0) != before.get(n, 0.0)}
                exposed = {family(n) for n in after}
                if moved == MOVES and {family(n) for n in wanted} <= exposed:
                    break
                if asyncio.get_running_loop().time() > deadline:
                    break
    finally:
        await nc.close()
    varz_after = varz(watched)

    assert sorted(MOVES - moved) == [], "queried metrics that did not move under load"
    for name in queried():
        if name.startswith("jetlake_"):
            assert family(name) in exposed, f"{name} is queried but not in /metrics"
        else:
            field = name.removeprefix("gnatsd_varz_")
            assert isinstance(varz_after.get(field), int), f"{name}: no field {field} in /varz"
    for name in NATS_MOVES:
        field = name.removeprefix("gnatsd_varz_")
        assert varz_after[field] > varz_before[field], name
