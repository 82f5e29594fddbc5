"""A discovery-handler process imports what it runs: the standalone server, the CLI and a handler
that makes no HTTP calls leave httpx and the Kubernetes client unloaded (ONVIF's SOAP client is
httpx-based, so only that handler brings httpx in)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
import akri_trio.discovery.cli, akri_trio.discovery.standalone
from akri_trio.discovery.handlers import load_handler
load_handler({handler!r}, {{}})
print(sorted(m for m in sys.modules if m == "httpx" or m.startswith("akri_trio.kube")))
"""


@pytest.mark.parametrize("handler", ["debugEcho", "udev", "opcua", "zeroconf"])
def test_a_discovery_handler_process_loads_no_httpx_nor_kube(handler: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(handler=handler)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "[]"
