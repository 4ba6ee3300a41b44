"""Stopping on a signal: SIGTERM or SIGINT to the driver, or to its whole process group (what
systemd, supervisord, Kubernetes and a terminal's Ctrl-C send), is a graceful stop.

A PySpark driver is two processes in one group: Python and the JVM that PySpark starts. Sent to
the group, SIGTERM reaches both; the JVM's default handler runs its shutdown hooks, which stop the
SparkContext under the Python driver's feet (Java ``RejectedExecutionException`` and Py4J
``ConnectionRefusedError`` traces, and no graceful stop). PySpark already starts its JVM with
SIGINT ignored; :func:`jvm_ignores_stop_signals` makes it ignore SIGTERM too (through
``sun.misc.Signal``, as Spark's own ``SignalUtils`` registers handlers), so that the Python driver
alone decides how to stop. The JVM still ends with the driver: PySpark's gateway exits when the
Python process closes its stdin, and SIGKILL ends it as before. Python workers are unaffected:
PySpark's daemon puts them in a process group of their own.

:class:`StopSignals` turns SIGTERM and SIGINT into an event the main loop waits on (the main job
and the drill use it); ``spark.streaming.stopGracefullyOnShutdown=true`` (Spark's key, default
false) makes ``StreamingContext.start()`` do the same for any app: the signal stops the context
gracefully, honouring ``spark.streaming.gracefulStopTimeout``.
"""

from __future__ import annotations

import logging
import signal
import threading

from sparkwal.base.service import Service

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def jvm_ignores_stop_signals(sc) -> bool:
    """Make the JVM of ``sc`` ignore SIGTERM and SIGINT (see the module docstring); False where
    that cannot be done (no ``sun.misc.Signal``), which is logged."""
    try:
        jvm = sc._jvm
        ignore = jvm.sun.misc.SignalHandler.SIG_IGN
        for name in ("TERM", "INT"):
            jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal(name), ignore)
        return True
    except Exception as e:  # noqa: BLE001  a JVM without sun.misc: signals keep their default
        log.info("the JVM keeps its own SIGTERM handler: %s", e)
        return False


class StopSignals:
    """SIGTERM and SIGINT set :attr:`requested` (a ``threading.Event``) and call ``on_signal``;
    a second one while stopping leaves the handlers in place (a stop in progress is not cut
    short by an impatient Ctrl-C; SIGKILL is the way to cut it). Install from the main thread."""

    def __init__(self, on_signal=None):
        self.requested = threading.Event()
        self.signal_name: str | None = None
        self._on_signal = on_signal
        self.install()

    def install(self) -> None:
        """(Re)install the handlers: PySpark's ``SparkContext`` replaces SIGINT's with one that
        cancels every job and raises KeyboardInterrupt, so call this again once it started."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, _frame) -> None:
        if self.requested.is_set():
            return
        self.signal_name = signal.Signals(signum).name
        self.requested.set()
        if self._on_signal is not None:
            self._on_signal(self.signal_name)


def stop_gracefully_on_signals(ssc) -> StopSignals | None:
    """``spark.streaming.stopGracefullyOnShutdown``: a stop signal stops ``ssc`` gracefully (on a
    thread of its own: a signal handler must not block). Only from the main thread, where Python
    runs signal handlers; returns None elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        log.warning("spark.streaming.stopGracefullyOnShutdown needs start() on the main thread")
        return None
    jvm_ignores_stop_signals(ssc.sparkContext)

    def stop(name: str) -> None:
        log.warning("%s received: stopping the streaming context gracefully", name)
        # not a daemon: the process waits for the graceful stop to finish
        Service("sparkwal-signal-stop", lambda: ssc.stop(stopSparkContext=True, stopGraceFully=True),
                daemon=False).start()

    return StopSignals(stop)
