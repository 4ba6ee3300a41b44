"""What a streaming app's console shows: its own output, and sparkwal's errors as one line each, as
the main job's console does.

* An error sparkwal raises on purpose (a :class:`SparkwalError`: a refused checkpoint, a batch that
  failed in the JVM, storage down past its deadline) that the app does not catch ends the program
  with one line on standard error, ``app.py:31: <message>`` (the app's own line it came through),
  and status 1, instead of a Python traceback (with a Py4J and a Java one inside). Installed when
  the app makes or recovers a ``StreamingContext``, and only while ``sys.excepthook`` is Python's
  own (an app's hook stays); ``SPARKWAL_TRACEBACK=1`` in the environment shows the traceback and the
  Java trace. Any other error (a bug in the app's own driver code) is Python's to show, as before.
* When the stream starts, Spark's console progress bar (``[Stage 3:> (0 + 2) / 2]``, drawn over the
  app's ``pprint`` lines) is stopped, and Spark's log level becomes ERROR, with the loggers that repeat
  a failed task's trace (the batch's own one line names its error) at FATAL, where the app left them
  at PySpark's defaults: ``spark.sparkwal.console.quiet`` (true). An app that set a level of its own
  (``sc.setLogLevel``) keeps its console as it is; the levels are put back when the context stops (a
  notebook goes on with its own console; Spark's bar, once stopped, does not start again).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from sparkwal.base.errors import SparkwalError

from . import config
from .config import StreamingConf
from .errors import is_library_code, one_line

log = logging.getLogger(__name__)

TRACEBACK_ENV = "SPARKWAL_TRACEBACK"
#: the loggers that repeat a failed task's Python and Java traces (as the main job's log4j2-quiet.properties)
TASK_TRACE_LOGGERS = ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager",
                      "org.apache.spark.scheduler.TaskSchedulerImpl", "org.apache.spark.api.python.PythonRunner")


def _one_line_hook(kind, value, tb) -> None:
    if isinstance(value, SparkwalError) and not os.environ.get(TRACEBACK_ENV):
        sys.stderr.write(f"{_where(tb)}: {value}\n")
        sys.stderr.flush()
        return
    sys.__excepthook__(kind, value, tb)
    if isinstance(value, SparkwalError) and hasattr(value, "java_trace"):  # asked for: all of it
        sys.stderr.write(f"the Java exception: {value.java_trace()}\n")


def _where(tb) -> str:
    """The app's own line that the error came through (``app.py:31``; the innermost frame outside
    sparkwal, PySpark and Python's library), else the program's name."""
    line = None
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if not is_library_code(path):
            line = f"{os.path.basename(path)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return line or (os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python")


def one_line_errors() -> None:
    """From now on, a sparkwal error the program does not catch ends it with one line (status 1)."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _one_line_hook


def quiet_spark(sc, settings: StreamingConf) -> Callable[[], None] | None:
    """Spark's console progress bar stopped and its log level made ERROR where the app left them
    at PySpark's defaults (see above); returns what puts the levels back (the context's stop calls
    it: a notebook or shell goes on with its own console), None where nothing was changed."""
    if not settings[config.CONSOLE_QUIET]:
        return None
    try:
        # PySpark's default WARN is a threshold Spark keeps apart from the root level until the app
        # sets a level of its own (sc.setLogLevel clears it): org.apache.spark.internal.Logging
        spark_logging = getattr(getattr(sc._jvm.org.apache.spark.internal, "Logging$"), "MODULE$")
        threshold = spark_logging.sparkShellThresholdLevel()
        if threshold is None:
            return None  # the app chose its level: its console is its own
        log4j = sc._jvm.org.apache.logging.log4j
        configurator = log4j.core.config.Configurator
        root = log4j.LogManager.getRootLogger().getLevel()
        levels = {name: log4j.LogManager.getLogger(name).getLevel() for name in TASK_TRACE_LOGGERS}
        bar = sc._jsc.sc().progressBar()
        if bar.isDefined():
            bar.get().stop()  # (for good: Spark's bar has no start again)
        sc.setLogLevel("ERROR")
        for name in TASK_TRACE_LOGGERS:
            configurator.setLevel(name, log4j.Level.FATAL)
    except Exception as e:  # noqa: BLE001 (a Spark without these members: its console as it is)
        log.info("Spark's console left as it is: %s", one_line(e))
        return None

    def put_back() -> None:
        try:
            configurator.setRootLevel(root)
            getattr(spark_logging, "sparkShellThresholdLevel_$eq")(threshold)
            for name, level in levels.items():
                configurator.setLevel(name, level)
        except Exception as e:  # noqa: BLE001 (the JVM stopped with the context: nothing to put back)
            log.debug("Spark's log levels not put back: %s", one_line(e))
    return put_back
