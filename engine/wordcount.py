"""``python -m sparkwal.engine.wordcount``: the main job, :mod:`sparkwal.engine.apps.wordcount`, by the
name the README's first command and scripts use (older checkpoints' names for its functions are
:mod:`sparkwal.engine.driver.program_layouts`')."""

from sparkwal.engine.apps.wordcount import build, main
from sparkwal.engine.apps.wordcount_data import (expected_counts, expected_line_counts, file_lines,
                                        receiver_line, write_input_file)

__all__ = ["build", "expected_counts", "expected_line_counts", "file_lines", "main",
           "receiver_line", "write_input_file"]

if __name__ == "__main__":
    import sys

    sys.exit(main())
