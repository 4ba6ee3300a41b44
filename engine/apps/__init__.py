"""Apps built on sparkwal's public API, outside the library's core: the main job
(:mod:`.wordcount`, its direct mode :mod:`.direct_wordcount`), the kill-and-restart drills
(:mod:`.drill`, with :mod:`.direct_drill`, :mod:`.receiver_drill`, :mod:`.standby_drill` and
what they share, :mod:`.drill_runs`), their argument checks and exit statuses (:mod:`.arguments`)
and a standalone Spark cluster on this machine (:mod:`.standalone`).

    python -m sparkwal.engine.wordcount ...   (or: sparkwal run wordcount ...)
    python -m sparkwal.engine.drill ...       (or: sparkwal drill ...)
    sparkwal ui CHECKPOINT / sparkwal status CHECKPOINT   (:mod:`.history`)
"""

from __future__ import annotations

import importlib
import sys

#: ``sparkwal run APP``: the apps of :mod:`sparkwal.engine.apps`, each run with its own arguments.
APPS = {"wordcount": "sparkwal.engine.apps.wordcount"}


def run_from_command(argv: list[str]) -> int:
    """``sparkwal run APP ARGS`` and ``sparkwal drill ARGS`` (``argv`` from ``run`` or ``drill`` on):
    the app's own ``main(ARGS)``, its exit statuses (:mod:`sparkwal.engine.apps.arguments`) and its
    ``--help``."""
    if argv[0] in ("ui", "status"):  # a checkpoint's event log: no Spark, so no app's main
        from .history import main

        return main(argv, prog=f"sparkwal {argv[0]}")
    if argv[0] == "drill":
        module, rest, prog = "sparkwal.engine.apps.drill", argv[1:], "sparkwal drill"
    elif len(argv) > 1 and argv[1] in ("-h", "--help"):
        print("usage: sparkwal run APP [ARGS]  (sparkwal run APP --help: the app's own)\n\napps:\n"
              + "\n".join(f"  {name:<10} {importlib.import_module(m).__doc__.splitlines()[0]}"
                          for name, m in APPS.items()))
        return 0
    elif len(argv) < 2 or argv[1] not in APPS:
        what = f"unknown app {argv[1]!r}" if len(argv) > 1 else "an app to run is missing"
        print(f"sparkwal run: {what}; apps: {', '.join(APPS)}", file=sys.stderr)
        return 2  # a usage error, as every sparkwal command
    else:
        module, rest, prog = APPS[argv[1]], argv[2:], f"sparkwal run {argv[1]}"
    return importlib.import_module(module).main(rest, prog=prog)


