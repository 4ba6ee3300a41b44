"""Running a test app as a subprocess in its own process group, killed with its group if it
outlives its time: its last stdout line, a JSON report, parsed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def run_app(script: str, args: list[str], *, cwd, env: dict, timeout_s: float) -> dict:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
    proc = subprocess.Popen([sys.executable, path, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            cwd=cwd, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", **env),
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return json.loads(out.strip().splitlines()[-1])
