"""akri-trio.

`__version__` is the package's version (pyproject.toml reads it from here): every process logs
it at start-up, and importlib.metadata, which would read it from the installed metadata, costs
each of them 0.7 MB of resident memory (zipfile, csv and its own modules).

Importing the package keeps httpx's command-line client out of every process: httpx's
`__init__` imports it (click and pygments: 1.6 MB of resident memory in each agent and
controller, for a `httpx` command nobody runs here) and falls back to a stub when that import
fails, which the finder below makes it do (and nothing else: it answers for that one name).
"""

import sys as _sys
from typing import Any as _Any

__version__ = "0.1.0"


class _NoHttpxCommandLine:
    @staticmethod
    def find_spec(name: str, path: _Any = None, target: _Any = None) -> None:
        if name == "httpx._main":
            raise ImportError("akri-trio does not load httpx's command-line client")


if _NoHttpxCommandLine not in _sys.meta_path:
    _sys.meta_path.insert(0, _NoHttpxCommandLine)
