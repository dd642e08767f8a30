"""Spark reads the messages table through the ``jetlake`` data source, without delta-spark."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import spark_jobs.datasource as datasource
from spark_jobs.datasource import MESSAGE_SCHEMA, arrow_schema, list_blocks, read_block
from spark_jobs.session import check_java, java_major_version
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format.nats import parse_headers, subject_matches

STREAM = "ORDERS"
BLOCK_SIZE = 400
COUNT = 1000
BASE_TS = 1_700_000_000_123_456_789
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SUBJECTS = ["orders.eu.new", "orders.us.new", "orders.eu.paid", "orders.ap.paid.late", "orders.eu"]


def _message(seq: int, stream: str = STREAM) -> StoredMessage:
    hdrs = None
    if seq % 3 == 0:
        hdrs = f"NATS/1.0\r\nNats-Msg-Id: id-{seq}\r\nTrace: first\r\nTrace: second\r\n\r\n".encode()
    return StoredMessage(
        stream=stream,
        block_size=BLOCK_SIZE,
        seq=seq,
        ts=BASE_TS + seq * 1_001,  # not whole microseconds: ts must truncate, ts_ns must not
        subject=SUBJECTS[seq % len(SUBJECTS)],
        hdrs=hdrs,
        data=b"\x00\xff" + f"payload-{seq}".encode(),
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[StoredMessage]]:
    """1,000 messages in blocks 0-2, committed 250 at a time so blocks hold several files, next to
    another stream whose rows must never leak into an ORDERS read."""
    root = str(tmp_path_factory.mktemp("store"))
    table = MessageTable(StoreRoot(root))
    messages = [_message(seq) for seq in range(1, COUNT + 1)]
    for version, start in enumerate(range(0, COUNT, 250), start=1):
        table.commit(messages[start : start + 250], version)
    table.commit([_message(seq, "OTHER") for seq in range(1, 11)], 5)
    return root, messages


def _read(spark: SparkSession, root: str, **options: str) -> DataFrame:
    # The store has no catalog: the raw table is what these tests read.
    reader = spark.read.format("jetlake").option("root", root).option("stream", STREAM).option("view", "raw")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _assert_same_messages(actual: DataFrame, expected: DataFrame) -> None:
    """chispa's ``ignore_row_order`` sorts by ``hash(headers)``, which Spark 4 refuses for maps, so
    both sides are put in sequence order instead (unique within a stream read)."""
    assert_df_equality(actual.orderBy("seq"), expected.orderBy("seq"))


def _expected(spark: SparkSession, messages: list[StoredMessage]) -> DataFrame:
    rows = [
        (
            m.stream,
            m.seq,
            EPOCH + timedelta(microseconds=m.ts // 1000),
            m.ts,
            m.subject,
            parse_headers(m.hdrs),
            m.data,
        )
        for m in messages
    ]
    return spark.createDataFrame(rows, MESSAGE_SCHEMA)


@pytest.mark.spark
def test_reads_every_message_of_the_stream(
    spark: SparkSession, store: tuple[str, list[StoredMessage]]
) -> None:
    root, messages = store
    df = _read(spark, root)
    assert df.schema == MESSAGE_SCHEMA
    _assert_same_messages(df, _expected(spark, messages))


@pytest.mark.spark
def test_one_partition_per_block_in_sequence_order(
    spark: SparkSession, store: tuple[str, list[StoredMessage]]
) -> None:
    root, _ = store
    df = _read(spark, root)
    assert df.rdd.getNumPartitions() == 3
    # Blocks are planned in order and each is read by sequence, so no shuffle is needed for order.
    assert [r.seq for r in df.select("seq").collect()] == list(range(1, COUNT + 1))


@pytest.mark.spark
def test_sequence_range_is_inclusive_and_prunes_blocks(
    spark: SparkSession, store: tuple[str, list[StoredMessage]]
) -> None:
    root, messages = store
    df = _read(spark, root, start_seq="350", end_seq="420")
    assert df.rdd.getNumPartitions() == 2
    expected = _expected(spark, [m for m in messages if 350 <= m.seq <= 420])
    _assert_same_messages(df, expected)
    assert _read(spark, root, start_seq="990").count() == 11
    assert _read(spark, root, end_seq="0").count() == 0


@pytest.mark.spark
@pytest.mark.parametrize(
    ("subject_filter", "expected_subjects"),
    [
        ("orders.*.new", {"orders.eu.new", "orders.us.new"}),
        ("orders.eu.>", {"orders.eu.new", "orders.eu.paid"}),
        ("orders.>", set(SUBJECTS)),
        ("orders.*", {"orders.eu"}),
        ("orders.ap.paid.late", {"orders.ap.paid.late"}),
        ("nothing.>", set()),
    ],
)
def test_subject_filter(
    spark: SparkSession,
    store: tuple[str, list[StoredMessage]],
    subject_filter: str,
    expected_subjects: set[str],
) -> None:
    root, messages = store
    df = _read(spark, root, subject=subject_filter, start_seq="100")
    wanted = [m for m in messages if m.subject in expected_subjects and m.seq >= 100]
    _assert_same_messages(df, _expected(spark, wanted))


@pytest.mark.spark
def test_headers_map(spark: SparkSession, store: tuple[str, list[StoredMessage]]) -> None:
    root, _ = store
    df = _read(spark, root, start_seq="3", end_seq="4")
    rows = {
        r.seq: r for r in df.select("seq", "headers", F.col("headers")["Nats-Msg-Id"].alias("id")).collect()
    }
    assert rows[3].headers == {"Nats-Msg-Id": "id-3", "Trace": "first"}
    assert rows[3].id == "id-3"
    assert rows[4].headers == {}
    assert rows[4].id is None


@pytest.mark.spark
def test_missing_store_reads_empty(spark: SparkSession, tmp_path: Path) -> None:
    df = _read(spark, str(tmp_path / "nowhere"))
    assert df.count() == 0


@pytest.mark.spark
def test_required_options(spark: SparkSession) -> None:
    with pytest.raises(Exception, match="'root' and 'stream'"):
        spark.read.format("jetlake").option("stream", STREAM).load()


def test_partitions_are_small_and_picklable(store: tuple[str, list[StoredMessage]]) -> None:
    root, _ = store
    parts = list_blocks(StoreRoot(root), STREAM)
    assert [p.block for p in parts] == [0, 1, 2]
    assert [len(p.files) for p in parts] == [2, 3, 1]
    for p in parts:
        assert pickle.loads(pickle.dumps(p)) == p
        assert len(pickle.dumps(p)) < 1024
    assert [p.block for p in list_blocks(StoreRoot(root), STREAM, 401, 500)] == [1]


def test_batches_are_cut_by_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small messages travel in few large batches, large payloads in small ones: no batch holds
    more than the byte budget (beyond a single row) or more rows than the row cap."""
    root = StoreRoot(str(tmp_path))
    table = MessageTable(root)
    small = [replace_data(_message(seq), b"s") for seq in range(1, 301)]
    large = [replace_data(_message(seq), b"L" * 10_000) for seq in range(301, 400)]
    table.commit(small + large, 1)
    monkeypatch.setattr(datasource, "BATCH_BYTES", 100_000)
    monkeypatch.setattr(datasource, "BATCH_ROWS", 256)
    schema = arrow_schema(MESSAGE_SCHEMA)
    batches = [b for part in list_blocks(root, STREAM) for b in read_block(root, part, None, schema)]
    assert [s for b in batches for s in b.column("seq").to_pylist()] == list(range(1, 400))
    assert max(b.num_rows for b in batches) <= 256
    assert all(b.nbytes <= 100_000 or b.num_rows == 1 for b in batches)
    assert batches[0].num_rows == 256  # one-byte payloads: the row cap cuts
    large_batches = [b.num_rows for b in batches if b.column("seq")[0].as_py() > 300]
    assert len(large_batches) >= 9
    assert max(large_batches) <= 10  # 10 kB payloads: the byte budget cuts


def replace_data(m: StoredMessage, data: bytes) -> StoredMessage:
    return StoredMessage(m.stream, m.block_size, m.seq, m.ts, m.subject, m.hdrs, data)


@pytest.mark.parametrize(
    ("subject_filter", "subject", "matches"),
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("a.b", "a.b.c", False),
        ("a.*.c", "a.x.c", True),
        ("a.*", "a.x.c", False),
        ("a.>", "a.x.c", True),
        ("a.>", "a", False),
        (">", "a", True),
        ("*", "a.b", False),
        ("*.*", "a.b", True),
        ("a*.b", "ax.b", False),
        ("a.b", "a..b", False),
        ("", "anything.at.all", True),
    ],
)
def test_subject_matches(subject_filter: str, subject: str, matches: bool) -> None:
    assert subject_matches(subject_filter, subject) is matches


def test_parse_headers() -> None:
    block = b"NATS/1.0 503 No Responders\r\nA: 1\r\nB:two words \r\nA: 2\r\nbroken line\r\n\r\n"
    assert parse_headers(block) == {"A": "1", "B": "two words"}
    assert parse_headers(None) == {}
    assert parse_headers(b"") == {}


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_301"', 8),
        ("garbage", None),
    ],
)
def test_java_major_version(output: str, major: int | None) -> None:
    assert java_major_version(output) == major


def test_missing_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="openjdk-17-jre-headless"):
        check_java()
