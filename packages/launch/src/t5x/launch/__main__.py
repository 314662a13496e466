"""``python -m t5x.launch`` is ``t5x-launch``."""

import sys

from t5x.launch._cli import main

if __name__ == "__main__":
    sys.exit(main())
