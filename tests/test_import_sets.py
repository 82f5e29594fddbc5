"""Each process imports what it runs: the controller, the webhook and the CLI load no discovery
handler's library, and the agent loads one only for a handler it embeds (`--embedded-handler`),
so an agent with no handler or with debugEcho alone carries none of them. Checked in a fresh
interpreter, the way each process starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# The top-level packages that only a discovery handler needs (ONVIF's SOAP stack, OPC UA,
# mDNS, udev, the linear-time regex engine) and the OPC UA client's crypto.
HANDLER_LIBRARIES = frozenset({"zeep", "lxml", "asyncua", "zeroconf", "pyudev", "re2"})
CRYPTO = "cryptography"

# The agent's start-up up to its handlers: the CLI parses the flags, run_agent's first step
# builds the embedded handlers; what follows (watches, plugins) imports nothing per handler.
AGENT_PROBE = """
import json, os, sys
from akri_trio.agent.cli import parse_args
from akri_trio.agent.settings import embedded_handlers
embedded_handlers(parse_args({argv!r}, {{}}))
print(json.dumps(sorted({{m.partition(".")[0] for m in sys.modules}})))
"""
AGENT_FLAGS = ["--node-name", "n1"]


def top_level_modules(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def imported_by(*modules: str) -> set[str]:
    lines = [f"import {m}" for m in modules]
    lines.append(
        'import json, sys; print(json.dumps(sorted({m.partition(".")[0] for m in sys.modules})))'
    )
    return top_level_modules("\n".join(lines))


@pytest.mark.parametrize(
    "modules",
    [
        ("akri_trio.controller.cli", "akri_trio.controller.run"),
        ("akri_trio.cli",),
        ("akri_trio.teardown",),
    ],
    ids=["controller", "cli", "teardown"],
)
def test_the_controller_and_the_cli_import_no_handler_library(modules: tuple[str, ...]) -> None:
    loaded = imported_by(*modules)
    assert not loaded & HANDLER_LIBRARIES
    assert CRYPTO not in loaded


def test_the_webhook_imports_no_handler_library() -> None:
    # cryptography is the webhook's own: it makes and rotates its serving certificate.
    assert not imported_by("akri_trio.webhook.cli", "akri_trio.webhook.server") & HANDLER_LIBRARIES


def agent_imports(*flags: str) -> set[str]:
    return top_level_modules(AGENT_PROBE.format(argv=[*AGENT_FLAGS, *flags]))


@pytest.mark.parametrize(
    "flags", [(), ("--enable-debug-echo",), ("--embedded-handler", "debugEcho")], ids=str
)
def test_an_agent_without_a_library_handler_imports_none(flags: tuple[str, ...]) -> None:
    loaded = agent_imports(*flags)
    assert not loaded & HANDLER_LIBRARIES
    assert CRYPTO not in loaded


@pytest.mark.parametrize(
    ("handler", "libraries"),
    [("udev", {"pyudev", "re2"}), ("opcua", set()), ("zeroconf", {"re2"})],
)
def test_an_embedded_handler_brings_its_own_libraries_only(
    handler: str, libraries: set[str]
) -> None:
    # The OPC UA and mDNS clients are imported on the first discovery, not at start-up; re2
    # compiles the filters of the handlers that take them.
    assert agent_imports("--embedded-handler", handler) & HANDLER_LIBRARIES == libraries


@pytest.mark.parametrize(
    "modules",
    [
        ("akri_trio.agent.cli", "akri_trio.agent.run"),
        ("akri_trio.controller.cli", "akri_trio.controller.run"),
    ],
    ids=["agent", "controller"],
)
def test_the_agent_and_the_controller_load_no_command_line_toolkit(
    modules: tuple[str, ...],
) -> None:
    """httpx's own CLI (click, pygments) stays out: akri_trio/__init__.py."""
    loaded = imported_by(*modules)
    assert not loaded & {"click", "pygments", "rich"}
    assert "httpx" in loaded


def loaded_modules(*modules: str) -> set[str]:
    """Every module (not only top-level packages) `modules` import in a fresh interpreter."""
    lines = [f"import {m}" for m in modules]
    lines.append("import json, sys; print(json.dumps(sorted(sys.modules)))")
    return top_level_modules("\n".join(lines))


@pytest.mark.parametrize(
    "modules",
    [
        ("akri_trio.agent.cli", "akri_trio.agent.run"),
        ("akri_trio.controller.cli", "akri_trio.controller.run"),
    ],
    ids=["agent", "controller"],
)
def test_yaml_and_package_metadata_wait_for_their_first_use(modules: tuple[str, ...]) -> None:
    """In a Pod (in-cluster config, no Configuration yet) nothing parses YAML, and the start-up
    line's version is akri_trio.__version__: neither library is loaded at start-up."""
    loaded = loaded_modules(*modules)
    assert "yaml" not in loaded
    assert "importlib.metadata" not in loaded


def test_a_device_plugin_agent_imports_no_dra_module() -> None:
    """Only its care of claims a DRA-mode run left (`agent/dra/holdings*.py`, which import
    the rest of DRA only where a claim was left)."""
    loaded = loaded_modules("akri_trio.agent.cli", "akri_trio.agent.run")
    left = {
        "akri_trio.agent.dra",
        "akri_trio.agent.dra.holdings",
        "akri_trio.agent.dra.holdings_plan",
    }
    dra = {m for m in loaded if m.startswith(("akri_trio.dra", "akri_trio.agent.dra"))}
    assert dra <= left, dra - left


def test_the_holdings_dir_is_the_dra_driver_s() -> None:
    """The DRA state directory a device-plugin agent looks for is the driver's own."""
    from akri_trio.agent.dra.holdings import DRIVER_DIR
    from akri_trio.dra.names import DRIVER

    assert DRIVER_DIR == DRIVER
