"""``python -m jupyter_distrain.launchers.agent CMD``: the host agent (see :mod:`.host`)."""

import sys

from .host import main

sys.exit(main(sys.argv[1:]))
