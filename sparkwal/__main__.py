"""``python -m sparkwal ...``: the ``sparkwal`` command."""

import sys

from . import main

sys.exit(main())
