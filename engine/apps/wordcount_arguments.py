"""What the main job (:mod:`sparkwal.engine.apps.wordcount`) accepts on its command line, and the
checks of its ``--sink`` (a mistake: one line, status 2, as :mod:`sparkwal.engine.apps.arguments` says)."""

from __future__ import annotations

import argparse
import importlib.util
import os

from sparkwal.engine.apps import arguments as a


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The main job's arguments (``doc``: its help, the module's docstring)."""
    ap = a.parser(prog, doc)
    ap.add_argument("--dir", default="wordcount-run", help="work directory (input/output/checkpoint)")
    ap.add_argument("--batch", type=a.positive_seconds, default=1.0, help="batch duration in seconds")
    ap.add_argument("--files", type=a.count, default=20, help="files the bundled generator writes (0: none)")
    ap.add_argument("--seconds", type=a.non_negative_seconds, default=25, help="run time (0: until stopped)")
    ap.add_argument("--upgrade", action="store_true",
                    help="recover this program's graph with the checkpoint's data (code-free)")
    ap.add_argument("--master", default="local[2]",
                    help="Spark master (local[N], local-cluster[N,C,MB], spark://HOST:PORT)")
    ap.add_argument("--source", choices=["files", "receiver", "filelog"], default="files",
                    help="input mode")
    ap.add_argument("--source-port", type=a.port, help="receiver mode: the AckedLineSource's port")
    ap.add_argument("--source-secret-env", default="SPARKWAL_SOURCE_SECRET",
                    help="receiver mode: the environment variable holding the source's secret")
    ap.add_argument("--checkpoint", help="checkpoint directory, a path or any fsspec URL "
                    "(default WORKDIR/checkpoint)")
    ap.add_argument("--input", help="filelog mode: the log directory, a path or any fsspec URL "
                    "(default WORKDIR/log)")
    ap.add_argument("--sink", choices=["sqlite", "delta", "iceberg", "postgres", "kafka"], default=None,
                    help="filelog mode: where the counts go, SQLite (WORKDIR/output.db, the default), "
                    "a Delta table (WORKDIR/output.delta), PostgreSQL (--postgres) or Kafka (--kafka)")
    ap.add_argument("--postgres", metavar="CONNINFO",
                    help="--sink postgres: the database (libpq's conninfo; the password best in PGPASSWORD)")
    ap.add_argument("--kafka", metavar="HOST:PORT",
                    help="--sink kafka: the broker (the topic sparkwal-wordcount, created if missing)")
    ap.add_argument("--storage-option", action="append", metavar="KEY=VALUE", default=[],
                    help="an fsspec option of --checkpoint and --input (repeatable); credentials "
                    "are best left to the environment (see docs/cluster.md)")
    ap.add_argument("--standby", action="store_true",
                    help="run as a hot standby of the driver leading --dir's checkpoint (no input "
                    "of its own; takes the stream over when that driver dies; runs until stopped)")
    ap.add_argument("--conf", action="append", metavar="KEY=VALUE", default=[],
                    help="a Spark configuration entry (repeatable), e.g. "
                    "spark.streaming.driver.leaseTimeout=10s")
    ap.add_argument("--json", action="store_true", help="machine-readable events (JSON lines)")
    ap.add_argument("--verbose", action="store_true", help="Spark's own log lines (WARN and up)")
    return ap


def check_source_options(ap: argparse.ArgumentParser, args) -> None:
    """An input mode's own options given with another mode are a mistake, not ignored (one line, status 2)."""
    if args.input is not None and args.source != "filelog":
        ap.error(f"--input is for --source filelog (--source {args.source} reads "
                 + ("WORKDIR/input)" if args.source == "files" else "its AckedLineSource)"))
    if args.source_port is not None and args.source != "receiver":
        ap.error("--source-port is for --source receiver")


def check_sink(ap: argparse.ArgumentParser, args) -> None:
    """``--sink``: filelog mode only; delta needs its package; a work directory keeps the sink its
    output began with (one line, status 2)."""
    if args.postgres is not None and args.sink != "postgres":
        ap.error("--postgres is for --sink postgres")
    if args.kafka is not None and args.sink != "kafka":
        ap.error("--kafka is for --sink kafka")
    if args.sink is None:
        return
    if args.source != "filelog":
        ap.error(f"--sink {args.sink}: only with --source filelog (the other modes write WORKDIR/output)")
    from sparkwal.engine.apps.direct_wordcount import SINK_OUTPUTS, SINK_PACKAGES

    package = SINK_PACKAGES.get(args.sink)
    if package is not None and importlib.util.find_spec(package[0]) is None:
        ap.error(f"--sink {args.sink} needs the {package[0]} package: pip install 'sparkwal[{package[1]}]'")
    if args.sink == "postgres" and not args.postgres:
        ap.error("--sink postgres needs --postgres CONNINFO (the database to write to)")
    if args.sink == "kafka" and not args.kafka:
        ap.error("--sink kafka needs --kafka HOST:PORT (the broker to write to)")
    for sink, name in SINK_OUTPUTS.items():
        if sink != args.sink and os.path.exists(os.path.join(args.dir, name)):
            ap.error(f"--sink {args.sink}: {os.path.join(args.dir, name)} holds this work directory's output "
                     "from another sink: use that sink, or another --dir")
