"""Subprocess for crash tests: writes checkpoints (or metadata log entries) forever and prints
each one once it is durable.

usage: python checkpoint_writer_proc.py DIR START_TIME {dstream|metadata} [STORAGE_OPTIONS_JSON]
"""

import json
import os
import sys

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from sparkwal.checkpoint import Checkpoint, CheckpointWriter, MetadataLog  # noqa: E402

directory, start, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
blob = os.urandom(200_000)  # big enough that a kill often lands mid-write


def report(t):
    sys.stdout.write(f"{t}\n")
    sys.stdout.flush()


if kind == "dstream":
    w = CheckpointWriter(directory, keep=4, on_written=report, storage_options=options)
    t = start
    while True:
        w.write(Checkpoint(t, [t], {"t": t, "blob": blob}))
        t += 1
else:
    log = MetadataLog(directory, storage_options=options)
    t = start
    while True:
        if log.add(t, {"t": t, "pad": "x" * 100_000}):
            report(t)
        t += 1
