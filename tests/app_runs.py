"""Running a test app as a subprocess in its own process group, killed with its group if it
outlives its time: its last stdout line, a JSON report, parsed, with the tail of its stderr under
``"stderr"`` (for the assertion message when the report is not what the test expects)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def run_app(script: str, args: list[str], *, cwd, env: dict, timeout_s: float) -> dict:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
    proc = subprocess.Popen([sys.executable, path, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=cwd, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", **env),
                            start_new_session=True, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = out.strip().splitlines()
    assert lines, f"{script} printed no report; its stderr ends:\n{err[-4000:]}"
    return dict(json.loads(lines[-1]), stderr=err[-4000:])


def run_ok(*args, cwd=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """A command run to its end, which must succeed (the assertion shows its output's tail)."""
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc
