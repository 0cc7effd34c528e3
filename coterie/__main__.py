"""``python -m coterie``: the same as the ``coterie`` command."""

import sys

from coterie.cli import main

sys.exit(main())
