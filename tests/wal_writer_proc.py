"""Writer subprocess for crash tests: writes records forever, printing each one it got acknowledged.

usage: python wal_writer_proc.py LOG_DIR TAG THREADS [hold|flush]
Each acknowledged record ``TAG:thread:i`` is printed (and flushed) only after ``write`` returned.
With ``hold`` it writes one record, prints ``ready`` and then blocks (a lock holder to be killed);
with ``flush`` the log's durability is "flush" (records copied into a memory-mapped segment).
"""

import sys
import threading

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from sparkwal.wal import BatchedWriteAheadLog, FileBasedWriteAheadLog  # noqa: E402

log_dir, tag, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else ""
hold = mode == "hold"
log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=0.05,
                             durability="flush" if mode == "flush" else "fsync")
if threads > 1:
    log = BatchedWriteAheadLog(log)
out_lock = threading.Lock()
clock = [0]

if hold:
    log.write(b"holder", 1)
    print("ready", flush=True)
    sys.stdin.read()
    sys.exit(0)


def run(t):
    i = 0
    while True:
        rec = f"{tag}:{t}:{i}"
        with out_lock:
            clock[0] += 1
            now = clock[0]
        log.write(rec.encode() * 20, now)
        with out_lock:
            sys.stdout.write(rec + "\n")
            sys.stdout.flush()
        i += 1


workers = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
