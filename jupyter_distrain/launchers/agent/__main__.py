"""``python -m jupyter_distrain.launchers.agent CMD``: the host agent (see :mod:`.host`)."""

import sys

from jupyter_distrain.launchers.agent.host import main  # absolute: also run as the old name

sys.exit(main(sys.argv[1:]))
