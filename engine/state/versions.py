"""State versions: a stateful operator says which version of its state's values it writes, and how
a value an older version wrote becomes a current one (``StateSpec.function(f).stateVersion(2,
migrate=g)``, ``updateStateByKey(f, stateVersion=2, migrate=g)``, ``g(from_version, value) ->
value``).

Each snapshot's manifest records the version its values were written at
(:mod:`sparkwal.checkpoint.state_files`, ``state_version``; absent: 1). A chain read back at an
older version than the program's goes through ``migrate`` as it is read, every value once, before
the program's code sees it; the next snapshot is then a full one at the program's version (a chain
never mixes versions). A chain of a newer version than the program's (a rollback) is refused: no
function brings values back.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark import RDD

from sparkwal.checkpoint.errors import SnapshotError


def check(version: object, migrate: object) -> tuple[int, Callable | None]:
    """``(version, migrate)`` as a stateful operator keeps them, or a ValueError saying what they must be."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"a state version is a whole number of at least 1, got {version!r}")
    if migrate is not None and not callable(migrate):
        raise TypeError(f"migrate is a function (from_version, value) -> value, got {type(migrate).__name__}")
    return version, migrate


def written_at(manifest: dict) -> int:
    """The state version a snapshot's values were written at."""
    return int(manifest.get("state_version", 1))


def migrated(rows: RDD, chain_urls: list[str], manifests: list[dict], version: int,
             migrate: Callable | None, stream: str) -> RDD:
    """``rows`` ``(key, value, updated_ms)`` of a chain, its values brought to ``version``."""
    versions = sorted({written_at(m) for m in manifests})
    if versions == [version]:
        return rows
    where = f"state snapshot {chain_urls[-1]} ({stream})"
    if len(versions) > 1:
        raise SnapshotError(f"{where}: its chain mixes state versions {versions}")
    old = versions[0]
    if old > version:
        raise SnapshotError(f"{where} was written at state version {old}, newer than this program's ({version}): "
                            "a program cannot read a later version's state (roll forward, or restore the "
                            "checkpoint the older version wrote)")
    if migrate is None:
        raise SnapshotError(f"{where} was written at state version {old}, and this program's is {version} with no "
                            "migrate function: give one (stateVersion(version, migrate=g), g(from_version, value))")

    def bring(row):
        return row[0], migrate(old, row[1]), row[2]
    return rows.map(bring, preservesPartitioning=True)
