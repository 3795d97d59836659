"""``python -m cdi``: the same command as ``cdi`` (the controller and webhook images run it)."""

import sys

from cdi.cli import main

sys.exit(main())
