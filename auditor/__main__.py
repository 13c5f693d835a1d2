"""``python -m auditor``: the same as the ``format-audit`` console script."""

import sys

from .cli import main

sys.exit(main())
