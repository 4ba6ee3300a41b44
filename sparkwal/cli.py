"""The ``sparkwal`` command: inspect, verify, repair and copy write-ahead logs and checkpoints, run
the main job and the drills, and show what a checkpoint's drivers did.

    sparkwal wal inspect DIR [--records]      segments, records, the writer's lock or lease
    sparkwal wal verify DIR                   every record checked; problems by file and offset
    sparkwal wal repair DIR [--yes]           cut a torn tail; set damaged segments aside
    sparkwal checkpoint inspect DIR           a sparkwal app's or a Structured Streaming checkpoint
    sparkwal checkpoint verify DIR            every checkpoint file checked
    sparkwal checkpoint repair DIR [--yes]    make a checkpoint verify and restart (plan shown first)
    sparkwal checkpoint state DIR [--out F]   the newest state of each stateful stream, as a
                                              table (printed, or written as Parquet or Arrow)
    sparkwal checkpoint copy SRC DST          a consistent copy, also while its driver runs
    sparkwal checkpoint handover DIR          the leader finishes its batches and a standby (a new
                                              version's) takes the stream over [--timeout S]
    sparkwal upgrade plan DIR -- PROGRAM [ARGS]
                                              what deploying PROGRAM on the checkpoint would carry
                                              over, start anew, drop, migrate and re-run
    sparkwal run wordcount [ARGS]             the main job (python -m sparkwal.engine.wordcount ARGS)
    sparkwal drill [ARGS]                     the kill-and-restart drill (python -m sparkwal.engine.drill ARGS)
    sparkwal ui DIR [--port P] | status DIR   a checkpoint's driver runs and batches, served or printed

DIR is a local path or any fsspec URL (``--storage-option key=value``, repeatable, or the
environment's credentials). ``--json`` prints one JSON object instead of text. Exit status, the
same for every verb: 0 all is well, 1 a problem was found (damage, a DIR that does not exist or
is not a directory, a live writer or driver in the way, or a repair only planned), 2 a usage
error. Inspecting and verifying never write and never take a lock; repairing creates nothing
where there is nothing, takes the writer's lock and never deletes data: what it removes from
the way it moves aside, renamed ``<name>.damaged-<ms>``.
"""

from __future__ import annotations

import argparse
import difflib
import sys

from .checkpoint_verbs import (checkpoint_copy, checkpoint_handover, checkpoint_inspect, checkpoint_repair,
                               checkpoint_state, checkpoint_verify)
from .common import OK, PROBLEM, USAGE, MissingDirectory, UsageError, emit
from .upgrade_verbs import upgrade_plan
from .wal_verbs import wal_inspect, wal_repair, wal_verify

__all__ = ["OK", "PROBLEM", "USAGE", "build_parser", "main"]


#: the verbs run by the apps (:mod:`sparkwal.engine.apps`), with their own arguments and ``--help``
APP_VERBS = {"run": "run an app: sparkwal run wordcount [ARGS] (the main job)",
             "drill": "the kill-and-restart drill (sparkwal drill --help)",
             "ui": "serve a checkpoint's driver runs and batches (Spark's pages and REST API)",
             "status": "print a checkpoint's driver runs and batches"}


PLAN_HELP = ("what deploying a new version of the program on the checkpoint would carry over, start anew, drop, "
             "migrate, repartition and re-run (nothing started, nothing written)")


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of rows, 0 or more, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkwal", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    areas = parser.add_subparsers(dest="area", required=True, metavar="{wal,checkpoint,upgrade,run,drill,ui,status}")
    verbs = {
        "wal": {"inspect": (wal_inspect, "segments, records and the writer's lock or lease"),
                "verify": (wal_verify, "read every record with its checks"),
                "repair": (wal_repair, "cut a torn tail; set damaged segments aside (with --yes)")},
        "checkpoint": {
            "inspect": (checkpoint_inspect, "what a restart would use and where it would resume"),
            "verify": (checkpoint_verify, "check every checkpoint file"),
            "repair": (checkpoint_repair, "set damaged checkpoint files and log segments aside, make "
                       "the offsets/commits restartable (with --yes)"),
            "state": (checkpoint_state, "the newest state of each stateful stream, as a table"),
            "copy": (checkpoint_copy, "a consistent copy of a checkpoint into a new directory, also "
                     "while its driver runs (no lock, no pause)"),
            "handover": (checkpoint_handover, "ask the leader to finish its batches and hand the stream over "
                         "to a standby (a new version's: getOrCreate(..., upgrade=True, standby=True))")},
    }
    for area, commands in verbs.items():
        sub = areas.add_parser(area, help=f"{area} commands: {', '.join(commands)}", allow_abbrev=False).add_subparsers(
            dest="verb", required=True, metavar="{" + ",".join(commands) + "}")
        for verb, (func, text) in commands.items():
            p = sub.add_parser(verb, help=text, description=text, allow_abbrev=False)
            p.add_argument("dir", metavar="SRC" if verb == "copy" else "DIR", help="a local path or an fsspec URL")
            if verb == "copy":
                p.add_argument("dst", metavar="DST", help="a new directory: a local path or an fsspec URL")
            p.add_argument("--json", action="store_true", help="print one JSON object")
            p.add_argument("--storage-option", action="append", metavar="KEY=VALUE", default=[],
                           help=f"an fsspec storage option{' of SRC' if verb == 'copy' else ''} (repeatable)")
            if verb == "copy":
                p.add_argument("--dst-storage-option", action="append", metavar="KEY=VALUE", default=[],
                               help="an fsspec storage option of DST (repeatable)")
            if verb == "repair":
                p.add_argument("--yes", action="store_true", help="apply the plan")
            if verb == "handover":
                p.add_argument("--timeout", type=float, default=60.0,
                               help="seconds to wait for the standby's first batch (60)")
            if verb == "state":
                p.add_argument("--out", metavar="FILE", help="write the table (Parquet if FILE ends "
                               "in .parquet, else Arrow IPC); one file per stream when there are several")
                p.add_argument("--format", choices=["parquet", "arrow"], help="the --out file's format")
                p.add_argument("--stream", metavar="NAME", help="only this stream (names: checkpoint inspect)")
                p.add_argument("--limit", type=_limit, default=20, help="rows printed per stream (20)")
            if area == "wal" and verb == "inspect":
                p.add_argument("--records", action="store_true",
                               help="list records (tracker events decoded)")
            p.set_defaults(func=func)
    plan = areas.add_parser("upgrade", help="upgrade commands: plan", allow_abbrev=False).add_subparsers(
        dest="verb", required=True, metavar="{plan}").add_parser(
        "plan", help=PLAN_HELP, description=PLAN_HELP, allow_abbrev=False,
        usage="sparkwal upgrade plan DIR [--json] -- PROGRAM [ARGS...]")
    plan.add_argument("dir", metavar="DIR", help="the checkpoint: a local path or an fsspec URL")
    plan.add_argument("program", nargs="*", metavar="PROGRAM [ARGS...]",
                      help="the new version's Python file and its arguments, after --")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.add_argument("--timeout", type=float, default=300.0, help="seconds the program may take to build "
                      "its streams (300)")
    plan.set_defaults(func=upgrade_plan, storage_option=[])
    for verb, text in APP_VERBS.items():  # parsed by the app itself (see main): listed here
        areas.add_parser(verb, help=text, add_help=False, allow_abbrev=False)
    return parser


def _version() -> str:
    """sparkwal's version and the PySpark and Python it runs on (read without importing PySpark)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    try:
        pyspark = f"PySpark {version('pyspark')}"
    except PackageNotFoundError:
        pyspark = "no PySpark installed"
    return f"{__version__} on {pyspark}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in APP_VERBS:  # the apps, with their own arguments
        from sparkwal.engine.apps import run_from_command

        return run_from_command(argv)
    after = None
    if argv[:2] == ["upgrade", "plan"] and "--" in argv:  # the program's own arguments: never sparkwal's
        argv, after = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    parser = build_parser()
    if argv and argv[0].startswith("-") and argv[0].split("=")[0] not in ("-h", "--help", "--version"):
        near = difflib.get_close_matches(argv[0], ["--help", "--version"], n=1)  # never taken for it: said
        parser.error(f"unrecognized option {argv[0]}" + (f" (did you mean {near[0]}?)" if near else ""))
    args = parser.parse_args(argv)
    if after is not None:
        args.program = [*args.program, *after]
    try:
        return args.func(args)
    except UsageError as e:
        print(f"sparkwal: {e}", file=sys.stderr)
        return USAGE
    except MissingDirectory as e:
        emit(args, {"dir": args.dir, "error": str(e), "ok": False}, [])
        print(f"sparkwal: {e}", file=sys.stderr)
        return PROBLEM
    except Exception as e:  # noqa: BLE001 (one clear line, not a traceback)
        print(f"sparkwal: {e}", file=sys.stderr)
        return PROBLEM


if __name__ == "__main__":
    sys.exit(main())
