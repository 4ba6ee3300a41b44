"""What a streaming app shows of itself: Spark's streaming REST API and Streaming page, Prometheus
metrics, and every driver run's record, for a live driver (``StreamingContext.uiWebUrl``) or a
dead one (``sparkwal ui CHECKPOINT``).

* :mod:`.status`: one run's batches, receivers and storage samples, as Spark's REST API shows them
* :mod:`.recorder`: the driver's events turned into event records (:mod:`sparkwal.checkpoint.event_log`)
* :mod:`.catalog`: which runs a UI shows (the live one, those in the event log)
* :mod:`.routes`: what each URL answers; :mod:`.server`: the read-only HTTP server
* :mod:`.pages`, :mod:`.charts`: the HTML pages and their SVG charts; :mod:`.metrics`: Prometheus
"""

from .catalog import Catalog
from .server import UiServer
from .status import RunStatus

__all__ = ["Catalog", "RunStatus", "UiServer"]
