"""The main job's generated input and what it must count: the files of the file mode
(:func:`file_lines`), the receiver mode's lines (:func:`receiver_line`), and their expected word
counts, which the drills check the outputs against."""

from __future__ import annotations

import os
import time

WORDS = ["spark", "stream", "wal", "checkpoint", "batch", "driver", "executor", "record", "block",
         "offset", "commit", "state", "window", "python", "fsync", "crash"]


def file_lines(file_id: int) -> list[str]:
    """The content of generated file ``file_id``: 3 lines of 3-7 words."""
    return [" ".join([f"f{file_id}"] + [WORDS[(file_id * 7 + line * 3 + j) % len(WORDS)]
                                        for j in range(3 + (file_id + line) % 5)])
            for line in range(3)]


def expected_counts(file_ids) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i in file_ids:
        for line in file_lines(i):
            for w in line.split()[1:]:
                counts[w] = counts.get(w, 0) + 1
    return counts


def write_input_file(input_dir: str, file_id: int) -> None:
    """Write atomically (temp file, then rename), stamped with the time it appears."""
    tmp = os.path.join(input_dir, f".f{file_id}.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(file_lines(file_id)) + "\n")
    now = time.time()
    os.utime(tmp, (now, now))
    os.replace(tmp, os.path.join(input_dir, f"f{file_id:06d}.txt"))


def receiver_line(line_id: int) -> str:
    """Line ``line_id`` of the receiver input: ``r<id>`` and 3-6 words decided by the id."""
    return " ".join([f"r{line_id}"] + [WORDS[(line_id * 5 + j * 3) % len(WORDS)]
                                       for j in range(3 + line_id % 4)])


def expected_line_counts(line_ids) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i in line_ids:
        for w in receiver_line(i).split()[1:]:
            counts[w] = counts.get(w, 0) + 1
    return counts
