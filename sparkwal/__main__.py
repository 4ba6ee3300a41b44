"""``python -m sparkwal ...``: the ``sparkwal`` command (:mod:`sparkwal.cli`)."""

import sys

from .cli import main

sys.exit(main())
