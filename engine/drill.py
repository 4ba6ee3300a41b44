"""``python -m sparkwal.engine.drill``: the kill-and-restart drill, now :mod:`sparkwal.engine.apps.drill` (this
module stays so that the documented command keeps working)."""

from sparkwal.engine.apps.drill import main

__all__ = ["main"]

if __name__ == "__main__":
    import sys

    sys.exit(main())
