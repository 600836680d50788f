"""``python -m aqw.cli.bench``: the same as ``aqw bench``."""

import sys

from ._main import main

sys.exit(main())
