"""Where the suite's time goes, as docs/testing.md shows it: per kind and per file, from the times a
run wrote with ``SPARKWAL_TEST_TIMES=FILE``.

    python tests/time_table.py FILE [FILES_SHOWN]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def kind(nodeid: str, markers: list[str]) -> str:
    if "driver" in markers:
        return "drill (subprocess drivers)" if "drill" in nodeid else "subprocess driver"
    return "in-process, slow" if "slow" in markers else "in-process"


def main(path: str, shown: int = 25) -> None:
    times = json.load(open(path))
    total = sum(t["seconds"] for t in times.values())
    total_cpu = sum(t.get("cpu", 0.0) for t in times.values())
    kinds: dict[str, list[dict]] = defaultdict(list)
    files: dict[str, list[dict]] = defaultdict(list)
    for nodeid, t in times.items():
        kinds[kind(nodeid, t["markers"])].append(t)
        files[nodeid.split("::")[0]].append(t)

    def wall(ts: list[dict]) -> float:
        return sum(t["seconds"] for t in ts)

    def cpu(ts: list[dict]) -> float:
        return sum(t.get("cpu", 0.0) for t in ts)

    print("| Kind | Tests | Wall s | Share | CPU s | Share |\n|---|---|---|---|---|---|")
    for name, ts in sorted(kinds.items(), key=lambda kv: (-cpu(kv[1]), -wall(kv[1]))):
        print(f"| {name} | {len(ts)} | {wall(ts):.0f} | {wall(ts) / total:.0%} | {cpu(ts):.0f} | "
              f"{cpu(ts) / (total_cpu or 1):.0%} |")
    print(f"| all | {len(times)} | {total:.0f} | | {total_cpu:.0f} | |\n")
    print("| File | Tests | Wall s | CPU s |\n|---|---|---|---|")
    ranked = sorted(files.items(), key=lambda kv: (-cpu(kv[1]), -wall(kv[1])))
    for name, ts in ranked[:shown]:
        print(f"| `{name}` | {len(ts)} | {wall(ts):.0f} | {cpu(ts):.0f} |")
    rest = [t for _, ts in ranked[shown:] for t in ts]
    print(f"| {max(0, len(ranked) - shown)} other files | {len(rest)} | {wall(rest):.0f} | {cpu(rest):.0f} |")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
