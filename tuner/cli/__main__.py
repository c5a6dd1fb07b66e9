"""``python -m tuner.cli``: the ``tuner`` command."""

import sys

from . import main

sys.exit(main())
