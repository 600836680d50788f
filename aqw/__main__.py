"""``python -m aqw`` runs the ``aqw`` command line."""

import sys

from .cli import main

sys.exit(main())
