"""The main job's direct mode, now :mod:`sparkwal.engine.apps.direct_wordcount`.

A shim for pickled names: a direct-mode checkpoint written before the move holds its program
pickled by module path, calling ``sparkwal.engine.direct_wordcount._tag`` and ``write_batch``.
"""

from sparkwal.engine.apps.direct_wordcount import tag_line, write_batch

_tag = tag_line

__all__ = ["write_batch"]
