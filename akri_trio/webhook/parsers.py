"""The discoveryDetails parser of each built-in discovery handler, for the webhook.

The webhook must refuse exactly the details an agent would refuse, so it calls the handler's
own `parse_details` rather than a copy of its rules. Handlers are looked up in the same
registry the agent uses and built only when first asked for: a handler module brings its
protocol's libraries (pyudev, zeep, asyncua), which a webhook that never sees such a
Configuration need not import.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from akri_trio.discovery.handlers import BUILTIN, load_handler

# discoveryDetails text -> the handler's typed details, or InvalidDetails.
Parser = Callable[[str], object]


@functools.cache
def builtin_parser(name: str) -> Parser | None:
    """`parse_details` of the built-in handler called `name`; None for any other name."""
    if name not in BUILTIN:
        return None
    return load_handler(name, {}).parse_details
