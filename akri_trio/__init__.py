"""akri-trio.

Importing the package keeps httpx's command-line client out of every process: httpx's
`__init__` imports it (click and pygments: 1.6 MB of resident memory in each agent and
controller, for a `httpx` command nobody runs here) and falls back to a stub when that import
fails, which an empty module under its name makes it do.
"""

import sys as _sys
import types as _types

if "httpx" not in _sys.modules:
    _sys.modules.setdefault("httpx._main", _types.ModuleType("httpx._main"))
