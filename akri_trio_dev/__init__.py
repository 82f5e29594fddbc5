"""akri-trio's development tools, beside the product and never shipped in it: the real local
cluster the tests, the demo and the benchmarks run on (`cluster/`), the offline image builder
(`cluster/image.py`) and the demo (`demo.py`).

The wheel and the image hold `akri_trio` only, and nothing in `akri_trio` imports this package.
It is not installed: Python finds it when run from the repository root (`python -m` puts the
current directory on the path; pytest's `pythonpath` is "."), so a child interpreter that runs
it is started there (`run_cluster_command`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_cluster_command(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`python -m akri_trio_dev cluster ARGS` in a child interpreter started from the repository
    root, waited for; keyword arguments go to `subprocess.run` (output is text)."""
    return subprocess.run(
        [sys.executable, "-m", "akri_trio_dev", "cluster", *args], cwd=ROOT, text=True, **kwargs
    )
