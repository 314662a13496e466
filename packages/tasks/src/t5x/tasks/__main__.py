"""``python -m t5x.tasks`` runs the ``t5x-tasks`` command."""

import sys

from t5x.tasks._cli import main

sys.exit(main())
