"""``python -m aqw`` runs the ``aqw`` command line."""

import sys

from .cli._main import main

sys.exit(main())
