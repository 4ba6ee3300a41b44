"""A driver's lifecycle states (pyspark's ``StreamingContextState``) and the error of an operation
its state does not allow."""

from ..errors import StreamingContextStateError  # noqa: F401  (its home before the errors' root)

INITIALIZED, ACTIVE, STOPPED = "INITIALIZED", "ACTIVE", "STOPPED"
