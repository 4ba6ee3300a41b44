"""``faulty://``: the in-memory fsspec filesystem with failures injected on chosen calls.

``FaultyFileSystem.fail("write", times=2, partial=5)`` makes the next two ``write`` calls on files
it opened write only 5 bytes and then raise ``OSError(EIO)`` (a torn write). Operations that can
fail: ``open`` (creating/opening a file), ``write``, ``flush``, ``pipe`` (whole-object puts),
``rm`` (deletes), ``ls``.
"""

from __future__ import annotations

import errno

import fsspec
from fsspec.implementations.memory import MemoryFileSystem


class FaultyFileSystem(MemoryFileSystem):
    protocol = "faulty"
    plan: dict[str, list] = {}
    calls: dict[str, int] = {}

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str) and path.startswith("faulty://"):
            path = "memory://" + path[len("faulty://"):]
        return super()._strip_protocol(path)

    @classmethod
    def reset(cls) -> None:
        cls.plan = {}
        cls.calls = {}

    @classmethod
    def fail(cls, op: str, times: int = 1, partial: int = 0) -> None:
        cls.plan[op] = [times, partial]

    @classmethod
    def maybe_fail(cls, op: str) -> int | None:
        cls.calls[op] = cls.calls.get(op, 0) + 1
        entry = cls.plan.get(op)
        if entry and entry[0] > 0:
            entry[0] -= 1
            return entry[1]
        return None

    def _open(self, path, mode="rb", **kwargs):
        if "r" not in mode and self.maybe_fail("open") is not None:
            raise OSError(errno.EIO, f"injected open failure: {path}")
        f = super()._open(path, mode, **kwargs)
        return f if mode == "rb" else _FaultyFile(f)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        if self.maybe_fail("pipe") is not None:
            raise OSError(errno.EIO, f"injected put failure: {path}")
        return super().pipe_file(path, value, mode=mode, **kwargs)

    def rm_file(self, path):
        if self.maybe_fail("rm") is not None:
            raise OSError(errno.EIO, f"injected delete failure: {path}")
        return super().rm_file(path)

    def ls(self, path, detail=True, **kwargs):
        if self.maybe_fail("ls") is not None:
            raise OSError(errno.EIO, f"injected list failure: {path}")
        return super().ls(path, detail=detail, **kwargs)


class _FaultyFile:
    def __init__(self, f):
        self._f = f

    def write(self, data):
        partial = FaultyFileSystem.maybe_fail("write")
        if partial is not None:
            self._f.write(bytes(data[:partial]))
            raise OSError(errno.EIO, "injected write failure")
        return self._f.write(data)

    def flush(self):
        if FaultyFileSystem.maybe_fail("flush") is not None:
            raise OSError(errno.EIO, "injected flush failure")
        return self._f.flush()

    def truncate(self, size):
        return self._f.truncate(size)

    def seek(self, *args):
        return self._f.seek(*args)

    def close(self):
        return self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)
