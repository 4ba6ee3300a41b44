"""The main job: a local Spark streaming word count over files appearing in a directory.

    python -m sparkwal.engine.wordcount [--dir WORKDIR] [--batch 1.0] [--files 20] [--seconds 25] [--json]
                               [--master local[2]] [--source files|receiver|filelog] [--upgrade]

* ``WORKDIR/input``: the input. With ``--files N`` the bundled generator writes N files there,
  one per batch interval, each line ``<file id> <word> <word> ...`` (content decided by the file
  id, so a verifier knows what to expect). Without it, files are expected from elsewhere (the
  drill writes them).
* ``--source receiver``: the input is lines ``r<id> <word> ...`` from a reliable receiver
  (:class:`sparkwal.engine.receiver.acked_lines.AckedLineReceiver`, receiver WAL on). With ``--source-port``
  it connects to an :class:`AckedLineSource` there (the drill's; the secret in the environment
  variable named by ``--source-secret-env``); without it the job runs its own source, fed with
  ``--files`` x 3 lines.
* ``--source filelog``: a direct stream (exactly once) over the append-only files of
  ``WORKDIR/log`` into SQLite (``WORKDIR/output.db``): see :mod:`sparkwal.engine.apps.direct_wordcount`. With
  ``--files N`` the job appends N x 3 lines itself; without, the lines come from elsewhere (the
  drill's appender). It also emits ``batch_committed`` events. ``--sink delta|iceberg`` writes the
  counts into a Delta table (``WORKDIR/output.delta``) or an Iceberg one (``WORKDIR/output.iceberg``), ``--sink
  postgres --postgres CONNINFO`` into PostgreSQL, as exactly.
* ``WORKDIR/output/batch-<ms>.json``: one file per batch time that read files, ``{"batch_ms",
  "files", "counts", "totals"}`` (``totals``: running word counts since the start, state kept by
  ``updateStateByKey`` across restarts), replaced atomically if the batch runs again after a
  restart: output is idempotent.
* ``WORKDIR/checkpoint``: the checkpoint; restarting with the same WORKDIR resumes from it.

On restart the context comes back from the checkpoint, program included (pyspark's
``getOrCreate`` contract); ``--upgrade`` instead applies the checkpoint's data to this program's
graph (code-free recovery, for a new version of the program). A line says which path was taken,
then one line per completed batch, as Spark's UI would show it (``batch 12:03:04: 1 files, 3
records (3/s) | scheduling 12 ms, processing 340 ms``), and a summary when it stops (with the
batches a restart re-ran); with ``--json`` these are JSON events instead (``context`` with
``recovery``, ``batch_completed``, ``stopped``), which is what tools read. Spark's start-up WARN
lines are left out unless ``--verbose``. SIGTERM or SIGINT, to the job or to its process group,
stops it gracefully within ``spark.streaming.gracefulStopTimeout`` (batches not done by then are
left to the restart). Runs until ``--seconds`` have passed (0: until stopped). A mistake in the
arguments or the environment is one line and status 2 (:mod:`sparkwal.engine.apps.arguments`).
"""

from __future__ import annotations

import json
import operator
import os
import sys
import time

from sparkwal.base.service import spawn

from .wordcount_data import receiver_line, write_input_file

#: kept for ``sparkwal.engine.wordcount``'s names (the progress line shows the records the engine counts)
BATCH_RECORDS: dict[int, int] = {}


def save_batch(out_url: str, t, rdd) -> None:
    """The output operation: one JSON file per batch time that read files, replaced atomically."""
    from sparkwal.wal import resolve

    storage, out_dir = resolve(out_url)
    batch_ms = int(round(t.timestamp() * 1000))
    out: dict[str, dict] = {"file": {}, "word": {}, "total": {}}
    for (kind, key), n in rdd.reduceByKey(operator.add).collect():
        out[kind][key] = n
    if not out["file"]:
        return
    body = json.dumps({"batch_ms": batch_ms, "files": sorted(out["file"]), "file_counts": out["file"],
                       "counts": out["word"], "totals": out["total"]}, sort_keys=True)
    storage.put(storage.join(out_dir, f"batch-{batch_ms}.json"), body.encode())


def build(sc, workdir: str, batch: float, *, upgrade: bool = False, json_events: bool = False,
          receiver: tuple[str, int, str] | None = None, direct: bool = False,
          checkpoint: str | None = None, storage_options: dict | None = None,
          input_url: str | None = None, standby: bool = False, sink: str = "sqlite",
          conninfo: str | None = None, bootstrap: str | None = None):
    """The app's context and its progress listener (not started: :func:`progress.say_context`
    says which it is once it is): the context made by ``setup`` on a fresh work
    directory, else recovered from its checkpoint (code included; with ``upgrade``, this
    program's graph with the checkpoint's data). ``receiver``: (host, port, secret variable) of
    an AckedLineSource to read instead of files. ``checkpoint`` (default ``WORKDIR/checkpoint``)
    may be any fsspec URL, with ``storage_options``; ``input_url`` is the direct mode's log
    directory (default ``WORKDIR/log``)."""
    from sparkwal.engine import StreamingContext
    from sparkwal.engine.apps import wordcount as app  # this module by its importable name (see setup)
    from sparkwal.engine.apps.progress import Progress
    from sparkwal.wal import resolve

    # main() runs in its work directory and passes ".": the program names its files relatively,
    # so a work directory copied or moved runs on its own input and output, never the original's
    input_dir = os.path.normpath(os.path.join(workdir, "input"))
    checkpoint_url = checkpoint or os.path.join(workdir, "checkpoint")
    out_url = os.path.normpath(os.path.join(workdir, "output"))
    out_storage, out_dir = resolve(out_url)
    out_storage.makedirs(out_dir)

    def setup():
        ssc = StreamingContext(sc, batch)
        ssc.checkpoint(checkpoint_url, storage_options=storage_options)
        if direct:
            from sparkwal.engine.apps.direct_wordcount import setup_direct

            setup_direct(ssc, workdir, input_url, storage_options, sink, conninfo, bootstrap)
            return ssc
        if receiver is None:
            source = ssc.textFileStream(input_dir, newFilesOnly=False)
        else:
            from sparkwal.engine.receiver.acked_lines import AckedLineReceiver

            host, port, secret_env = receiver
            source = ssc.receiverStream(AckedLineReceiver(host, port, secret_env=secret_env))
        lines = source.map(str.split).filter(bool)
        words = lines.flatMap(lambda ws: ws[1:]).map(lambda w: (w, 1))
        # snapshot the state every 2 batches (Spark's default, 10 s, means re-computing up to 10
        # batches of state after a crash: seconds of Spark jobs)
        totals = words.updateStateByKey(lambda new, total: sum(new) + (total or 0)).checkpoint(2 * batch)

        def tag(batch_lines, batch_totals):
            """One RDD of ((kind, key), n): lines per file, words counted, running totals."""
            def tagged(ws):
                return [(("file", ws[0]), 1)] + [(("word", w), 1) for w in ws[1:]]
            return (batch_lines.flatMap(tagged)
                    .union(batch_totals.map(lambda kv: (("total", kv[0]), kv[1]))))

        # through the importable module, not __main__: cloudpickle pickles a function of __main__
        # by value, and a recovered program would run that copy, not this module's code
        lines.transformWith(tag, totals).foreachRDD(lambda t, rdd: app.save_batch(out_url, t, rdd))
        return ssc

    ssc = StreamingContext.getOrCreate(checkpoint_url, setup, upgrade=upgrade,
                                       storage_options=storage_options, standby=standby)
    progress = Progress(json_events, batch, receiver is None and not direct)
    ssc.addStreamingListener(progress)  # listeners are not part of a checkpoint (as in pyspark)
    return ssc, progress


def _fail(message: str, status: int) -> int:
    print(f"sparkwal-wordcount: {message}", file=sys.stderr)
    return status


def main(argv: list[str] | None = None, prog: str = "python -m sparkwal.engine.wordcount") -> int:
    """The main job; exit statuses in :mod:`sparkwal.engine.apps.arguments` (a mistake: one line, status 2)."""
    from sparkwal.engine.apps import arguments as a  # (here: executors unpickling this module's functions skip them)
    from sparkwal.engine.apps.wordcount_arguments import check_sink, check_source_options, parser

    ap = parser(prog, __doc__)
    args = ap.parse_args(argv)
    a.check_environment(ap)
    from sparkwal.engine.apps.progress import emit, recovered, say_context, summary
    a.check_master(ap, args.master)
    confs = a.check_key_values(ap, args.conf, "--conf")
    a.check_worker_python(ap, args.master, confs)
    from sparkwal.wal.storage import parse_storage_options

    try:
        options = parse_storage_options(args.storage_option)
    except ValueError as e:
        ap.error(str(e))
    if args.source == "receiver" and args.source_port is not None and not os.environ.get(args.source_secret_env):
        ap.error(f"--source receiver: set {args.source_secret_env} to the source's secret")
    check_source_options(ap, args)
    check_sink(ap, args)
    a.local_path_is_directory(ap, args.checkpoint, "--checkpoint")
    a.local_path_is_directory(ap, args.input, "--input")
    args.checkpoint, args.input = a.absolute(args.checkpoint), a.absolute(args.input)
    checkpoint_url = args.checkpoint or os.path.join(os.path.abspath(args.dir), "checkpoint")
    a.check_own_checkpoint(prog, checkpoint_url, options, args.source)  # (refused: no --dir made)
    if not args.standby:
        a.check_no_leader(prog, checkpoint_url, options)
    workdir = a.usable_directory(ap, args.dir, "--dir")
    os.makedirs(os.path.join(workdir, "input"), exist_ok=True)
    # The program names its files relative to the work directory (see build): the job runs in it.
    # Its checkpoint/ must not shadow sparkwal's packages, for this interpreter (whose path may
    # hold the directory it started in, as "") nor for the Python workers its JVM starts there.
    sys.path[:] = [os.path.abspath(p) for p in sys.path]
    os.environ["PYTHONSAFEPATH"] = "1"
    os.chdir(workdir)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from sparkwal.engine.signals import StopSignals, jvm_ignores_stop_signals

    signals = StopSignals()  # before the JVM starts: a signal then ends the job quietly
    stop = signals.requested
    from pyspark import SparkConf

    from sparkwal.engine.apps.quiet_jvm import start_spark, stopping_after_failure

    from sparkwal.engine import EnvironmentShippingError, prepare_conf
    receiver = source = None
    if args.source == "receiver":
        port = args.source_port
        if port is None:  # a demo: the job feeds its own source
            from sparkwal.engine.receiver.acked_lines import AckedLineSource

            os.environ.setdefault(args.source_secret_env, os.urandom(16).hex())
            port_file = os.path.join(workdir, "source-port")  # a recovered receiver reconnects here
            port = int(open(port_file).read()) if os.path.exists(port_file) else 0
            source = AckedLineSource(os.environ[args.source_secret_env], port=port)
            port = source.address[1]
            with open(port_file, "w") as f:
                f.write(str(port))
        receiver = ("127.0.0.1", port, args.source_secret_env)

    conf = (SparkConf().setMaster(args.master).setAppName("sparkwal-wordcount").set("spark.ui.showConsoleProgress",
            "false").set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1"))
    if not args.verbose:  # Spark's start-up WARN lines stay out of the progress line's way
        quiet = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2-quiet.properties")
        conf.set("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{quiet}")
    else:  # Spark's log lines as it prints them (sparkwal.engine.console)
        conf.set("spark.sparkwal.console.quiet", "false")
    for key, value in confs:
        conf.set(key, value)
    if receiver is not None:  # executors' receivers read the source's secret from their environment
        conf.setExecutorEnv(args.source_secret_env, os.environ[args.source_secret_env])
    try:  # prepare_conf: off local mode, the environment shipped, the executors' workers set up
        sc = start_spark(prepare_conf(conf), args.verbose)
    except (ValueError, EnvironmentShippingError) as e:  # a bad switch, no virtualenv to ship
        return _fail(str(e), a.USAGE)
    except Exception as e:  # noqa: BLE001  (one line, not a Py4J trace)
        if stop.is_set():
            return _fail(f"stopped on {signals.signal_name} while Spark was starting", a.OK)
        return _fail(f"Spark did not start: {a.one_line(e)}", a.FAILED)
    jvm_ignores_stop_signals(sc)  # the Python driver decides how to stop (engine.signals)
    signals.install()  # PySpark's SparkContext took SIGINT over
    sc.setLogLevel("WARN" if args.verbose else "ERROR")
    direct = args.source == "filelog"
    if direct:
        os.makedirs(os.path.join(workdir, "log"), exist_ok=True)
    from sparkwal.engine.cluster import ExecutorEnvironmentError
    from sparkwal.engine import DriverAlreadyActiveError
    from sparkwal.wal import FencedError

    carried = None  # the running totals the checkpoint's state holds: the newest output it covers
    if receiver is None and not direct and not args.standby:
        from sparkwal.checkpoint import read_checkpoint

        try:
            restored = read_checkpoint(checkpoint_url, storage_options=options)
        except Exception:  # noqa: BLE001 (start() names a checkpoint that does not read)
            restored = None
        if restored is not None:
            carried = newest_totals(os.path.join(workdir, "output"), restored.checkpoint_time_ms)
    try:
        ssc, progress = build(sc, ".", args.batch, upgrade=args.upgrade, json_events=args.json,
                              receiver=receiver, direct=direct, checkpoint=args.checkpoint,
                              storage_options=options, input_url=args.input, standby=args.standby,
                              sink=args.sink or "sqlite", conninfo=args.postgres, bootstrap=args.kafka)
        ssc.start()
    except ExecutorEnvironmentError as e:
        sc.stop()
        return _fail(str(e).replace("\n", "; "), a.USAGE)
    except DriverAlreadyActiveError as e:  # it took the lead between the look before the JVM and now
        sc.stop()
        return _fail(a.leader_held_line(e.leader.describe(), checkpoint_url), a.LEADER_HELD)
    except Exception as e:  # noqa: BLE001
        sc.stop()
        return _fail(f"could not start: {a.one_line(e)}", a.STORAGE if a.storage_fault(e) else a.FAILED)
    say_context(ssc, args.json)
    if ssc.recovery != "new" and carried is not None:
        say_totals("resumed", carried, args.json)
    if ssc.uiWebUrl:  # off with --conf spark.ui.enabled=false
        emit({"event": "ui", "url": ssc.uiWebUrl, "spark_ui": sc.uiWebUrl}, args.json,
             f"UI: {ssc.uiWebUrl}/streaming/")

    def generate() -> None:
        if source is not None:
            for i in range(args.files):
                if stop.wait(args.batch):
                    return
                source.offer(receiver_line(3 * i + j) for j in range(3))
            return
        if receiver is not None:
            return
        if direct:
            from sparkwal.engine.apps.direct_wordcount import PARTITIONS, append_lines, logged_lines

            have = logged_lines(os.path.join(workdir, "log"))
            for i in range(sum(have.values()) // 3, args.files):
                if stop.wait(args.batch):
                    return
                p = PARTITIONS[i % len(PARTITIONS)]
                append_lines(os.path.join(workdir, "log"), p, have.get(p, 0), 3)
                have[p] = have.get(p, 0) + 3
            return
        existing = len([n for n in os.listdir(os.path.join(workdir, "input")) if n.endswith(".txt")])
        for i in range(existing, args.files):
            if stop.wait(args.batch):
                return
            write_input_file(os.path.join(workdir, "input"), i)

    try:
        if ssc.isStandby():
            lead = ssc.currentLeader()
            emit({"event": "standby", "leader": lead.holder if lead else None,
                  "leader_epoch": lead.epoch if lead else None}, args.json,
                 f"standby: waiting to take over from {lead.describe() if lead else 'the active driver'}")
            while not stop.is_set() and not ssc.awaitLeadership(0.2):
                pass
        else:
            spawn("wordcount-input", generate)
        if not stop.is_set():
            recovered(ssc, args.json, args.batch)
        deadline = time.monotonic() + args.seconds if args.seconds and not args.standby else None
        leader = ssc.driver
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            if ssc.awaitTerminationOrTimeout(0.2):
                break
            if ssc.driver is not leader:  # fenced, it rejoined as a standby (getOrCreate(..., standby=True))
                fence, leader = leader.fenced or leader.error, ssc.driver
                emit({"event": "rejoined", "standby": ssc.isStandby(), "message": str(fence)}, args.json,
                     f"fenced ({fence}): rejoined as a {'standby' if ssc.isStandby() else 'leader'}")
    except FencedError as e:
        emit({"event": "fenced", "message": str(e)}, args.json, f"fenced: {e}")
        stopping_after_failure()
        ssc.stop(stopSparkContext=True, stopGraceFully=False)  # 4 if its lease lapsed on the storage
        storage = a.storage_fault(e)  # its lease lapsed while the store failed: the storage's fault (status 4)
        return _fail(f"{'the storage failed: ' if storage else ''}this driver was fenced and wrote nothing more: {e}",
                     a.STORAGE if storage else a.FENCED)
    except Exception as e:  # noqa: BLE001  a batch failed: one line, the checkpoint resumes it
        emit({"event": "failed", "message": a.one_line(e)}, args.json, "")
        stopping_after_failure()
        ssc.stop(stopSparkContext=True, stopGraceFully=False)
        status = a.STORAGE if a.storage_fault(e) else a.FAILED
        return _fail(f"{'the storage failed' if status == a.STORAGE else 'a batch failed'}, the job stopped "
                     f"(a restart resumes from the checkpoint): {a.one_line(e)}", status)
    if stop.is_set():
        emit({"event": "stopping", "signal": signals.signal_name}, args.json,
             f"{signals.signal_name}: stopping gracefully (at most "
             f"{ssc.graceful_stop_timeout_s():.0f} s; SIGKILL cuts it short, the checkpoint resumes)")
    ssc.stop(stopSparkContext=True, stopGraceFully=True)
    if direct:
        from sparkwal.engine.apps.direct_wordcount import SINK_OUTPUTS, read_results

        if args.sink == "postgres":
            from sparkwal.engine.sinks.postgres import without_password

            output = f"the table sparkwal_wordcount of {without_password(args.postgres)}"
        elif args.sink == "kafka":
            output = f"the topic sparkwal-wordcount of {args.kafka}"
        else:
            output = os.path.join(workdir, SINK_OUTPUTS[args.sink or "sqlite"])
        summary(ssc, progress, args.json, read_results(workdir)["batches"], output, signals.signal_name)
        return a.OK
    outputs = [n for n in os.listdir(os.path.join(workdir, "output")) if n.endswith(".json")]
    ended = newest_totals(os.path.join(workdir, "output")) if receiver is None else None
    if ended is not None:
        say_totals("totals", ended, args.json)
    summary(ssc, progress, args.json, len(outputs), os.path.join(workdir, "output"), signals.signal_name)
    return a.OK


def newest_totals(out_dir: str, up_to_ms: int | None = None) -> dict | None:
    """The newest batch output's (``batch_ms`` and ``totals``: the ``updateStateByKey`` state as of that
    batch), of the batches up to ``up_to_ms`` (a checkpoint's time: the state it holds); None: none."""
    import re

    times = sorted(int(m.group(1)) for m in (re.fullmatch(r"batch-(\d+)\.json", n) for n in
                   (os.listdir(out_dir) if os.path.isdir(out_dir) else [])) if m)
    times = [t for t in times if up_to_ms is None or t <= up_to_ms]
    if not times:
        return None
    with open(os.path.join(out_dir, f"batch-{times[-1]}.json")) as f:
        return json.load(f)


def say_totals(kind: str, newest: dict, json_events: bool) -> None:
    """The running totals of a batch output: at a restart what it resumes with (``resumed``), at the
    stop where it ended (``totals``)."""
    from sparkwal.base.times import clock_time
    from sparkwal.engine.apps.progress import emit

    words, counted = len(newest["totals"]), sum(newest["totals"].values())
    emit({"event": kind, "words": words, "counted": counted, "as_of_ms": newest["batch_ms"]}, json_events,
         f"{'resumed with the' if kind == 'resumed' else 'the'} running totals as of "
         f"{clock_time(newest['batch_ms'])}: {counted} words counted, {words} distinct"
         + (" (the state carried over from the checkpoint)" if kind == "resumed" else ""))


if __name__ == "__main__":
    sys.exit(main())
