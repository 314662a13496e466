"""Upstream's ``t5x.train``: ``train`` with upstream's keywords, and ``python -m t5x.train``.

``python -m t5x.train --gin_file=... --gin.NAME=VALUE`` runs as ``t5x-launch train ...``
(upstream's flags translated; see ``t5x.upstream.run_command_line``).
"""

import sys

from t5x.upstream import GIN_DIR, train

# Where upstream's run files are found (its tests add these to gin's search path).
_DEFAULT_GIN_SEARCH_PATHS = [str(GIN_DIR)]

__all__ = ["train"]

if __name__ == "__main__":
    from t5x.upstream import run_command_line

    sys.exit(run_command_line("train"))
