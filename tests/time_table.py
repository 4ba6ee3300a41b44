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
    kinds: dict[str, list[float]] = defaultdict(list)
    files: dict[str, list[float]] = defaultdict(list)
    for nodeid, t in times.items():
        kinds[kind(nodeid, t["markers"])].append(t["seconds"])
        files[nodeid.split("::")[0]].append(t["seconds"])
    print("| Kind | Tests | Seconds | Share |\n|---|---|---|---|")
    for name, seconds in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {name} | {len(seconds)} | {sum(seconds):.0f} | {sum(seconds) / total:.0%} |")
    print(f"| all | {len(times)} | {total:.0f} | |\n")
    print("| File | Tests | Seconds |\n|---|---|---|")
    ranked = sorted(files.items(), key=lambda kv: -sum(kv[1]))
    for name, seconds in ranked[:shown]:
        print(f"| `{name}` | {len(seconds)} | {sum(seconds):.0f} |")
    rest = ranked[shown:]
    print(f"| {len(rest)} other files | {sum(len(s) for _, s in rest)} | {sum(sum(s) for _, s in rest):.0f} |")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
