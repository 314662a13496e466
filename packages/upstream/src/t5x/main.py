"""Upstream's ``t5x.main``: ``python -m t5x.main --run_mode=train|eval|infer|precompile ...``.

Runs as ``t5x-launch <run_mode> ...`` (upstream's flags translated; see
``t5x.upstream._command_line``).
"""

import sys

if __name__ == "__main__":
    from t5x.upstream import run_command_line

    sys.exit(run_command_line(None))
