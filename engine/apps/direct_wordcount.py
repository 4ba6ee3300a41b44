"""The main job's direct mode (``python -m sparkwal.engine.wordcount --source filelog``): exactly-once word
counts from a FileLogSource into SQLite.

* ``WORKDIR/log/<partition>``: append-only files of lines ``<partition>-<n> <word> ...`` (line
  ``n`` of a partition; words decided by both, see :func:`direct_line`);
* ``WORKDIR/output.db``: ``word_counts(word, n)`` running totals, ``partition_lines(partition,
  n)`` lines counted per partition, ``batches(batch_ms, records)``, and the sink's
  ``sparkwal_offsets``: results and offsets of a batch commit in one transaction, so every line
  appended is counted exactly once whatever kills the driver (the drill checks it).
"""

from __future__ import annotations

import json
import operator
import os
import sqlite3
import uuid

from .wordcount_data import WORDS

PARTITIONS = ("p0", "p1")


def direct_line(partition: str, n: int) -> str:
    seed = sum(map(ord, partition)) * 31 + n
    return " ".join([f"{partition}-{n}"] + [WORDS[(seed * 7 + j * 5) % len(WORDS)]
                                            for j in range(2 + seed % 4)])


def expected_direct_counts(lines_per_partition: dict[str, int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p, n in lines_per_partition.items():
        for i in range(n):
            for w in direct_line(p, i).split()[1:]:
                counts[w] = counts.get(w, 0) + 1
    return counts


def append_lines(logdir: str, partition: str, start: int, count: int) -> None:
    """Append lines ``start .. start+count-1`` of ``partition`` in one write."""
    with open(os.path.join(logdir, partition), "a") as f:
        f.write("".join(direct_line(partition, start + i) + "\n" for i in range(count)))
        f.flush()


def logged_lines(logdir: str) -> dict[str, int]:
    """Complete lines in each partition file of ``logdir``."""
    out = {}
    for name in os.listdir(logdir) if os.path.isdir(logdir) else []:
        if not name.startswith((".", "_")):
            with open(os.path.join(logdir, name), "rb") as f:
                out[name] = f.read().count(b"\n")
    return out


def tag_line(line: str):
    words = line.split()
    if not words:
        return []
    return [(("lines", words[0].rsplit("-", 1)[0]), 1)] + [(("word", w), 1) for w in words[1:]]


#: the drill's ``--speculation``, in the executors' environment: at most how many milliseconds the
#: first attempt of every other task of the output stage waits for a copy of it to start, and where
#: each copy leaves a file as it starts
SLOW_FIRST_ATTEMPTS_ENV = "SPARKWAL_DRILL_SLOW_FIRST_ATTEMPTS_MS"
SPECULATED_DIR_ENV = "SPARKWAL_DRILL_SPECULATED_DIR"
#: how long a slowed first attempt lets its copy run before it wakes: enough for the copy to write and
#: finish first here, and well inside the 2 s after the copy's success that its executor gives it before
#: killing it (``spark.python.task.killTimeout``); on a slower day the two write side by side
COPY_HEAD_START_S = 1.0


def slow_first_attempts(index: int, counts):
    """The output stage's records; under the drill's ``--speculation``, the first attempt of every
    other task waits until a copy of it has started (each later attempt, a copy or a retry, leaves a
    file in :data:`SPECULATED_DIR_ENV`'s directory as it starts; retries are rare there: a kill takes
    the driver's executors with it), however long a copy takes to start, up to the wait's bound; then
    it gives the copy :data:`COPY_HEAD_START_S` to write and finish first, and writes too."""
    pause_ms = int(os.environ.get(SLOW_FIRST_ATTEMPTS_ENV) or 0)
    if pause_ms:
        from pyspark import TaskContext

        context = TaskContext.get()
        started = os.environ.get(SPECULATED_DIR_ENV, "")
        # this task's attempts, apart from an earlier driver's (stage ids restart with each application;
        # the job group names the driver's run, a batch and an output operation)
        task = f"{context.getLocalProperty('spark.jobGroup.id')}-{context.stageId()}-{index}-" if context else ""
        if context is not None and context.attemptNumber() > 0:
            open(os.path.join(started, task + uuid.uuid4().hex), "w").close()
        elif context is not None and index % 2 == 0:
            import time

            deadline = time.monotonic() + pause_ms / 1000  # (the drill's slow task is what it drills; it
            copied = False  # waits for the copy's file, written by another process)
            while time.monotonic() < deadline and not copied:
                copied = any(n.startswith(task) for n in os.listdir(started))
                if not copied:
                    time.sleep(0.02)
            if copied:
                time.sleep(COPY_HEAD_START_S)
    return counts


def write_batch(cur, batch_ms: int, records: list) -> None:
    """The sink's ``write``: add the batch's counts to the running totals (one transaction)."""
    cur.execute("CREATE TABLE IF NOT EXISTS word_counts (word TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    cur.execute("CREATE TABLE IF NOT EXISTS partition_lines (partition TEXT PRIMARY KEY, "
                "n INTEGER NOT NULL)")
    cur.execute("CREATE TABLE IF NOT EXISTS batches (batch_ms INTEGER PRIMARY KEY, records INTEGER)")
    table = {"word": ("word_counts", "word"), "lines": ("partition_lines", "partition")}
    lines = 0
    for (kind, key), n in records:
        name, column = table[kind]
        cur.execute(f"INSERT INTO {name} ({column}, n) VALUES (?, ?) ON CONFLICT({column}) "
                    f"DO UPDATE SET n = n + excluded.n", (key, n))
        lines += n if kind == "lines" else 0
    cur.execute("INSERT OR REPLACE INTO batches VALUES (?, ?)", (batch_ms, lines))


def count_row(record) -> tuple:
    """A batch's count ``((kind, key), n)`` as a row of the Delta table."""
    (kind, key), n = record
    return kind, key, n


def count_rows_at(time, rdd):
    """A batch's counts as rows of the PostgreSQL table: ``(kind, key, n, batch_ms)``."""
    batch_ms = int(round(time.timestamp() * 1000))
    return rdd.map(lambda record: (*count_row(record), batch_ms))


def delta_sink(workdir: str):
    """``WORKDIR/output.delta``: each batch's counts appended as rows ``(kind, key, n)`` (kind
    ``word`` or ``lines``), partitioned by kind; the totals are their sums."""
    import pyarrow as pa

    from sparkwal.engine.sinks import DeltaSink

    schema = pa.schema([("kind", pa.string()), ("key", pa.string()), ("n", pa.int64())])
    return DeltaSink(os.path.normpath(os.path.join(workdir, "output.delta")), "wordcount", schema=schema,
                     partition_by=["kind"])


#: each ``--sink``'s Python package and the extra that installs it
SINK_PACKAGES = {"delta": ("deltalake", "delta"), "iceberg": ("pyiceberg", "iceberg"),
                 "postgres": ("psycopg", "postgres"), "kafka": ("confluent_kafka", "kafka")}
#: what holds each ``--sink``'s output in the work directory
SINK_OUTPUTS = {"sqlite": "output.db", "delta": "output.delta", "iceberg": "output.iceberg",
                "postgres": "output.postgres", "kafka": "output.kafka"}

#: ``WORKDIR/output.iceberg``: ``--sink iceberg``'s SQLite catalog (``catalog.db``) and warehouse,
#: the counts in the table ``sparkwal.wordcount`` as Delta's rows ``(kind, key, n)``
ICEBERG_DIR = "output.iceberg"


def iceberg_sink(workdir: str):
    """The Iceberg sink of ``--sink iceberg``: pyiceberg's SQL catalog on a SQLite file, the
    table partitioned by kind."""
    import pyarrow as pa

    from sparkwal.engine.sinks import IcebergSink

    root = os.path.abspath(os.path.join(workdir, ICEBERG_DIR))
    os.makedirs(root, exist_ok=True)
    schema = pa.schema([("kind", pa.string()), ("key", pa.string()), ("n", pa.int64())])
    catalog = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}
    return IcebergSink(catalog, "sparkwal.wordcount", "wordcount", schema=schema, partition_by=["kind"])


#: the PostgreSQL table of ``--sink postgres``: each batch's counts appended as rows ``(kind, key,
#: n, batch_ms)``
POSTGRES_TABLE = "sparkwal_wordcount"
#: ``WORKDIR/output.postgres``: the conninfo (no password) of the database holding the output
POSTGRES_MARKER = "output.postgres"


def postgres_sink(workdir: str, conninfo: str | None = None):
    """The PostgreSQL sink of ``--sink postgres`` (its table created if missing); ``conninfo``
    from ``WORKDIR/output.postgres`` when not given (written on first use)."""
    import psycopg

    from sparkwal.engine.sinks import PostgresSink
    from sparkwal.engine.sinks.postgres import without_password

    conninfo = _output_address(workdir, POSTGRES_MARKER, conninfo, without_password)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {POSTGRES_TABLE} (kind TEXT NOT NULL, key TEXT NOT NULL, "
                     "n BIGINT NOT NULL, batch_ms BIGINT NOT NULL)")
    return PostgresSink(conninfo, POSTGRES_TABLE, "wordcount")


#: ``WORKDIR/output.kafka``: the broker (``host:port``) holding the output of ``--sink kafka``:
#: each batch's counts as records key ``["word"|"lines", key]`` (JSON), value ``n``, in the topic
KAFKA_MARKER, KAFKA_TOPIC = "output.kafka", "sparkwal-wordcount"


def kafka_sink(workdir: str, bootstrap: str | None = None):
    """The Kafka sink of ``--sink kafka`` (its topic created with two partitions if missing);
    ``bootstrap`` from ``WORKDIR/output.kafka`` when not given (written on first use)."""
    from sparkwal.engine.sinks import KafkaSink

    bootstrap = _output_address(workdir, KAFKA_MARKER, bootstrap)
    return KafkaSink(KAFKA_TOPIC, {"bootstrap.servers": bootstrap}, "wordcount", partitions=2)


def count_record(record) -> tuple:
    """A batch's count ``((kind, key), n)`` as a Kafka record ``(key, value)``."""
    (kind, key), n = record
    return json.dumps([kind, key]), str(n)


def _output_address(workdir: str, marker: str, address: str | None, shown=lambda a: a) -> str:
    """``address`` remembered in ``WORKDIR/<marker>`` (as ``shown``: no secrets), or, not given,
    the one remembered there."""
    path = os.path.join(workdir, marker)
    if address is None:
        with open(path) as f:
            return f.read().strip()
    with open(path, "w") as f:
        f.write(shown(address) + "\n")
    return address


def setup_direct(ssc, workdir: str, input_url: str | None = None, storage_options: dict | None = None,
                 sink: str = "sqlite", conninfo: str | None = None, bootstrap: str | None = None):
    """The direct word count's graph on ``ssc`` (input: ``input_url``, default ``WORKDIR/log``;
    output: ``sink``, ``sqlite`` (WORKDIR/output.db), ``delta`` (WORKDIR/output.delta), ``iceberg``
    (the table ``sparkwal.wordcount`` of a SQLite catalog in WORKDIR/output.iceberg),
    ``postgres`` (the table ``sparkwal_wordcount`` of the database at ``conninfo``) or ``kafka``
    (the topic ``sparkwal-wordcount`` of the broker ``bootstrap``))."""
    from sparkwal.engine.apps import direct_wordcount as app  # by its importable name, not __main__
    from sparkwal.engine.sinks import SQLiteSink
    from sparkwal.engine.sources import FileLogSource

    source = (FileLogSource(input_url, storage_options) if input_url
              else FileLogSource(os.path.normpath(os.path.join(workdir, "log"))))
    if sink in ("delta", "iceberg", "postgres", "kafka"):
        table = {"delta": lambda: delta_sink(workdir), "iceberg": lambda: iceberg_sink(workdir),
                 "postgres": lambda: postgres_sink(workdir, conninfo),
                 "kafka": lambda: kafka_sink(workdir, bootstrap)}[sink]()
        stream = ssc.directStream(source, fromOffsets=table.offsets())
        counts = stream.flatMap(app.tag_line).reduceByKey(operator.add).mapPartitionsWithIndex(
            app.slow_first_attempts, preservesPartitioning=True)
        rows = {"delta": lambda: counts.map(app.count_row), "iceberg": lambda: counts.map(app.count_row),
                "postgres": lambda: counts.transform(app.count_rows_at),
                "kafka": lambda: counts.map(app.count_record)}[sink]()
        table.saveStream(rows, stream)
        return stream
    database = SQLiteSink(os.path.normpath(os.path.join(workdir, "output.db")), "wordcount")
    stream = ssc.directStream(source, fromOffsets=database.offsets())
    counts = stream.flatMap(app.tag_line).reduceByKey(operator.add).mapPartitionsWithIndex(
        app.slow_first_attempts, preservesPartitioning=True)
    database.saveStream(counts, stream, app.write_batch)
    return stream


def read_results(workdir: str) -> dict:
    """What the output holds, the SQLite database's, the Delta or Iceberg table's (read through the
    sink's own reader), the PostgreSQL table's or the Kafka topic's (the sink's reader):
    ``{"words": {...}, "lines": {...}, "batches": n}``."""
    if os.path.isdir(os.path.join(workdir, "output.delta", "_delta_log")):
        return _read_delta_results(workdir)
    if os.path.exists(os.path.join(workdir, ICEBERG_DIR, "catalog.db")):
        return _read_table_results(iceberg_sink(workdir))
    if os.path.exists(os.path.join(workdir, POSTGRES_MARKER)):
        return _read_postgres_results(workdir)
    if os.path.exists(os.path.join(workdir, KAFKA_MARKER)):
        return _read_kafka_results(workdir)
    path = os.path.join(workdir, "output.db")
    if not os.path.exists(path):
        return {"words": {}, "lines": {}, "batches": 0}
    conn = sqlite3.connect(path)
    try:
        def table(sql):
            try:
                return dict(conn.execute(sql).fetchall())
            except sqlite3.OperationalError:  # no batch written yet
                return {}
        words = table("SELECT word, n FROM word_counts")
        lines = table("SELECT partition, n FROM partition_lines")
        batches = len(table("SELECT batch_ms, records FROM batches"))
    finally:
        conn.close()
    return {"words": words, "lines": lines, "batches": batches}


def _totals(rows) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = {"word": {}, "lines": {}}
    for kind, key, n in rows:
        totals[kind][key] = totals[kind].get(key, 0) + n
    return totals


def _read_delta_results(workdir: str) -> dict:
    return _read_table_results(delta_sink(workdir))


def _read_table_results(sink) -> dict:
    totals = _totals((r["kind"], r["key"], r["n"]) for r in sink.read().to_pylist())
    return {"words": totals["word"], "lines": totals["lines"], "batches": sink.batches_committed()}


def _read_kafka_results(workdir: str) -> dict:
    sink = kafka_sink(workdir)
    totals = _totals((*json.loads(key), int(value)) for key, value in sink.read())
    return {"words": totals["word"], "lines": totals["lines"], "batches": sink.batches_committed()}


def _read_postgres_results(workdir: str) -> dict:
    import psycopg

    with open(os.path.join(workdir, POSTGRES_MARKER)) as f:
        conninfo = f.read().strip()
    with psycopg.connect(conninfo) as conn:
        if conn.execute("SELECT to_regclass(%s)", (POSTGRES_TABLE,)).fetchone()[0] is None:
            return {"words": {}, "lines": {}, "batches": 0}
        totals = _totals(conn.execute(f"SELECT kind, key, n FROM {POSTGRES_TABLE}").fetchall())
        batches = conn.execute(f"SELECT count(DISTINCT batch_ms) FROM {POSTGRES_TABLE}").fetchone()[0]
    return {"words": totals["word"], "lines": totals["lines"], "batches": batches}
