"""``python -m sparkwal.engine.wordcount``: the main job, now :mod:`sparkwal.engine.apps.wordcount` (this module
stays so that the README's first command, scripts and old checkpoints keep working).

A shim for pickled names: checkpoints written before the main job moved hold its program pickled
by module path, calling ``sparkwal.engine.wordcount._save_batch`` and counting into
``sparkwal.engine.wordcount._BATCH_RECORDS``; both are the app's own objects under their old names.
"""

from sparkwal.engine.apps.wordcount import BATCH_RECORDS, build, main, save_batch
from sparkwal.engine.apps.wordcount_data import (expected_counts, expected_line_counts, file_lines,
                                        receiver_line, write_input_file)

_save_batch = save_batch
_BATCH_RECORDS = BATCH_RECORDS

__all__ = ["build", "expected_counts", "expected_line_counts", "file_lines", "main",
           "receiver_line", "write_input_file"]

if __name__ == "__main__":
    import sys

    sys.exit(main())
