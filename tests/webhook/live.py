"""A real `akri-trio webhook` process for the tests against the cluster, and its registration.

The process listens on 127.0.0.1 with a port the OS picks (the API server reaches loopback), so
parallel runs never collide; the port is read from its log. The ValidatingWebhookConfiguration
made here selects only namespaces carrying the test's own label, so other tests' Configurations
never reach this webhook (and never fail while it is down).
"""

from __future__ import annotations

import contextlib
import re
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import trio
import yaml

from akri_trio.kube import Client, Invalid
from akri_trio.webhook.rotation import WEBHOOK_CONFIGURATIONS as WEBHOOK_CONFIGURATIONS
from tests.support.polling import until_api

REPO = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(rb"webhook listening on 127\.0\.0\.1:(\d+)")


def make_certs(out: Path, name: str) -> dict[str, Any]:
    """`akri-trio webhook certs` into `out` (valid for 127.0.0.1 too); the configuration."""
    args = ["--service", "akri-webhook", "--namespace", "akri", "--ip", "127.0.0.1"]
    args += ["--out", str(out), "--name", name]
    done = subprocess.run(
        [sys.executable, "-m", "akri_trio", "webhook", "certs", *args],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    configuration: dict[str, Any] = yaml.safe_load(done.stdout)
    return configuration


def start_webhook(certs: Path, kubeconfig: Path, log: Path) -> subprocess.Popen[bytes]:
    args = ["--tls-cert-file", str(certs / "tls.crt"), "--tls-key-file", str(certs / "tls.key")]
    args += ["--host", "127.0.0.1", "--port", "0", "--kubeconfig", str(kubeconfig)]
    return run_webhook(args, log)


def run_webhook(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`akri-trio webhook ARGS`, its output into `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "akri_trio", "webhook", *args],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_webhook(process: subprocess.Popen[bytes]) -> None:
    process.terminate()  # SIGTERM: the command's nursery is cancelled and it exits 0
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def listening_port(process: subprocess.Popen[bytes], log: Path) -> int:
    """The port from the process's log, once it listens."""
    with trio.fail_after(30):
        while not (found := _LISTENING.search(await trio.Path(log).read_bytes())):
            if process.poll() is not None:
                output = await trio.Path(log).read_text()
                raise AssertionError(f"the webhook exited early:\n{output}")
            await trio.sleep(0.05)
    return int(found[1])


def trusting(ca_pem: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca_pem.decode())


async def wait_ready(port: int, ca_pem: bytes, log: Path) -> None:
    """Until /readyz answers 200: the process has fetched the cluster's OpenAPI document."""
    async with httpx.AsyncClient(verify=trusting(ca_pem)) as http:

        async def ready() -> bool:
            try:
                return (await http.get(f"https://127.0.0.1:{port}/readyz")).status_code == 200
            except httpx.TransportError:  # not listening yet (it writes its Secret first)
                return False

        try:
            await until_api(ready, 30, "/readyz 200")
        except AssertionError:
            output = await trio.Path(log).read_text()
            raise AssertionError(f"the webhook never became ready:\n{output}") from None


def by_url(configuration: dict[str, Any], port: int, label: tuple[str, str]) -> dict[str, Any]:
    """The `certs` configuration pointed at the loopback URL (keeping its caBundle), for
    namespaces labelled `label` only."""
    hook = configuration["webhooks"][0]
    hook["clientConfig"] = {
        "url": f"https://127.0.0.1:{port}/validate",
        "caBundle": hook["clientConfig"]["caBundle"],
    }
    hook["namespaceSelector"] = {"matchLabels": dict([label])}
    return configuration


async def wait_enforced(api: Client, probe: dict[str, Any]) -> None:
    """Until the API server sends Configurations to the webhook: a dry-run create of `probe`
    (one the webhook refuses) is denied. Registration reaches the API server asynchronously."""
    path = f"/apis/akri.sh/v0/namespaces/{probe['metadata']['namespace']}/configurations"

    async def denied() -> bool:
        try:
            await api.request("POST", path, params={"dryRun": "All"}, body=probe)
        except Invalid as exc:
            if "denied the request" in str(exc):
                return True
            raise
        return False

    await until_api(denied, 30, "a dry-run create denied by the webhook")


async def hold_idle_and_slow(
    port: int, trusted: ssl.SSLContext, count: int
) -> list[trio.SSLStream[trio.SocketStream]]:
    """`count` TLS connections to the webhook, opened one after another: half kept alive after
    one request (idle), half stopped in the middle of a request head (slow)."""
    held = []
    for i in range(count):
        stream = trio.SSLStream(
            await trio.open_tcp_stream("127.0.0.1", port), trusted, server_hostname="127.0.0.1"
        )
        await stream.do_handshake()
        if i % 2:
            await stream.send_all(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Le")
        else:
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await stream.receive_some()).startswith(b"HTTP/1.1 200 ")
        held.append(stream)
    return held


async def still_open(streams: list[trio.SSLStream[trio.SocketStream]]) -> int:
    """How many of `streams` the server has not closed (each given 10 ms to show EOF)."""
    count = 0
    for stream in streams:
        with trio.move_on_after(0.01):
            with contextlib.suppress(trio.BrokenResourceError):  # a reset
                await stream.receive_some()  # EOF: closed by the server
            continue
        count += 1
    return count
