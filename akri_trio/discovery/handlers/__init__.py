"""The discovery handlers this project ships, by their upstream names.

The agent (embedded handlers) and `akri-trio discovery-handler <name>` both look handlers up
here. Modules are imported only when their handler is chosen, so a debugEcho process never
imports zeep or asyncua.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from akri_trio.discovery.interface import AnyHandler

# name -> "module:factory"; the factory takes the environment and returns a handler.
BUILTIN: dict[str, str] = {
    "debugEcho": "akri_trio.discovery.handlers.debug_echo:DebugEcho.from_env",
    "onvif": "akri_trio.discovery.handlers.onvif:Onvif.from_env",
    "opcua": "akri_trio.discovery.handlers.opcua:Opcua.from_env",
    "udev": "akri_trio.discovery.handlers.udev:UdevHandler.from_env",
    "zeroconf": "akri_trio.discovery.handlers.zeroconf_handler:Zeroconf.from_env",
}


class UnknownHandler(LookupError):
    pass


def load_handler(name: str, env: Mapping[str, str]) -> AnyHandler:
    """Build the built-in handler called `name`, configured from `env`."""
    try:
        target = BUILTIN[name]
    except KeyError:
        known = ", ".join(sorted(BUILTIN))
        raise UnknownHandler(f"unknown discovery handler {name!r} (known: {known})") from None
    module_name, _, attr_path = target.partition(":")
    obj: object = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    handler: AnyHandler = obj(env)  # type: ignore[operator]
    return handler
