"""How long a transactional producer of the Kafka sink takes to start, with librdkafka's
``reconnect.backoff.ms`` (100 ms) and with the sink's (:data:`RECONNECT_BACKOFF_MS`), in one run.

    python -m benchmarks.kafka_start_bench [--starts 20]

A start is what a task of a per-partition write pays for a producer it has not got yet, and what
the driver pays for its own and for each transactional id it fences: ``Producer(...)`` and the sink's
``init_transactions`` (two metadata requests, then librdkafka's own), against the Tansu broker on
127.0.0.1. The two settings alternate, each start with a transactional id of its own, after one
uncounted start of each. Reported: the median and the largest start per setting."""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=20)
    args = ap.parse_args(argv)
    if args.starts < 1:
        ap.error(f"--starts must be at least 1, got {args.starts}")
    from confluent_kafka import Producer

    from sparkwal.engine.apps.kafka_server import tansu_broker
    from sparkwal.engine.sinks import KafkaSink
    from sparkwal.engine.sinks.kafka_markers import init_transactions, librdkafka_log

    with tansu_broker() as bootstrap:
        sinks = KafkaSink("start-bench", {"bootstrap.servers": bootstrap}).conf  # the sink's producers' settings
        settings = {"librdkafka's default (100 ms)": {k: v for k, v in sinks.items() if k != "reconnect.backoff.ms"},
                    "the sink's": sinks}
        took: dict[str, list[float]] = {name: [] for name in settings}
        for i in range(args.starts + 1):
            for j, (name, conf) in enumerate(settings.items()):
                start = time.perf_counter()
                producer = Producer({**conf, "transactional.id": f"start-{i}-{j}", "logger": librdkafka_log})
                init_transactions(producer, "start-bench", 30)
                if i > 0:  # the first of each warms up
                    took[name].append((time.perf_counter() - start) * 1000)
    print("| reconnect.backoff.ms | producer start p50 ms | max ms |")
    print("|---|---:|---:|")
    for name, ms in took.items():
        print(f"| {name} | {statistics.median(ms):.1f} | {max(ms):.1f} |")
    print(json.dumps({name: {"p50_ms": statistics.median(ms), "max_ms": max(ms)} for name, ms in took.items()}))


if __name__ == "__main__":
    main()
