"""A driver's lifecycle states (pyspark's ``StreamingContextState``) and the error of an operation
its state does not allow."""

INITIALIZED, ACTIVE, STOPPED = "INITIALIZED", "ACTIVE", "STOPPED"


class StreamingContextStateError(RuntimeError):
    """An operation not allowed in the context's current state."""
