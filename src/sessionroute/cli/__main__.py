"""``python -m sessionroute.cli``: the ``sessionroute`` command."""

import sys

from sessionroute.cli import main

sys.exit(main())
