"""``python -m cdi``: the same command as ``cdi`` (the controller and webhook images run it).

The commands live on the roof (``commands/``); this module only keeps the name the deployed
images and manifests use.
"""

import sys

from commands.main import main

sys.exit(main())
