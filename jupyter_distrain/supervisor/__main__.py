"""``python -m jupyter_distrain.supervisor JOB_DIR``: run one job's supervisor."""

import sys

from . import main

sys.exit(main())
