"""sparkwal's base room: what every other room stands on, the command included.

:mod:`.errors` holds :class:`SparkwalError`, the root of every error sparkwal raises;
:mod:`.service` the one way sparkwal runs a background thread; :mod:`.times` batch times as a person
reads them. Nothing here imports another room.
"""

from .errors import SparkwalError
from .service import Service, spawn
from .times import batch_name, clock_time

__all__ = ["Service", "SparkwalError", "batch_name", "clock_time", "spawn"]
