"""``python -m tuner``: the ``tuner`` command (the console script's entry point, ``tuner.cli:main``)."""

import sys

from .cli import main

sys.exit(main())
