"""A real headless browser for page tests: Debian's chromium driven over the DevTools protocol.

The dashboard's promise is what a person sees, so its tests load the page in chromium and read
the DOM the page's own script built. The protocol is JSON over a websocket (trio-websocket, a
dependency already); this client sends one command at a time and skips the events it did not
ask for. Chromium picks its own debugging port (`--remote-debugging-port=0`) and says which on
stderr, which goes to a file so a chatty browser never blocks on a full pipe.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import trio
import trio_websocket

LISTENING = re.compile(rb"DevTools listening on (ws://127\.0\.0\.1:(\d+)/\S+)")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab: `call` a DevTools method, `evaluate` an expression, wait for one to hold."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        await self.ws.send_message(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = json.loads(await self.ws.get_message())
            if msg.get("id") == ident:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result

    async def evaluate(self, expression: str) -> Any:
        reply = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def until(self, expression: str, poll_s: float = 0.02) -> Any:
        """Evaluate until truthy; its value. The caller bounds the wait."""
        while not (value := await self.evaluate(expression)):  # noqa: ASYNC110  (polling the page)
            await trio.sleep(poll_s)
        return value

    async def goto(self, url: str) -> None:
        await self.call("Page.enable")
        await self.call("Page.navigate", url=url)
        await self.until("document.readyState === 'complete'")

    async def screenshot(self) -> bytes:
        reply = await self.call("Page.captureScreenshot", format="png")
        return base64.b64decode(reply["data"])


@contextlib.asynccontextmanager
async def open_page(profile: Path, *, width: int = 1280, height: int = 900) -> AsyncIterator[Page]:
    """A headless chromium with a fresh profile in `profile`; its first tab. Stopped on exit."""
    exe = chromium()
    assert exe is not None, "chromium is not installed (apt-get install -y chromium)"
    await trio.Path(profile).mkdir(parents=True, exist_ok=True)
    log_path = trio.Path(profile / "stderr.log")
    with (profile / "stderr.log").open("wb") as log:
        proc = await trio.lowlevel.open_process(
            [
                exe,
                "--headless=new",
                "--no-sandbox",  # tests run as root, where chromium's sandbox refuses to start
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        with trio.fail_after(30):
            while not (found := LISTENING.search(await log_path.read_bytes())):
                assert proc.returncode is None, await log_path.read_text(errors="replace")
                await trio.sleep(0.05)
            port = int(found.group(2))
            async with httpx.AsyncClient() as client:
                targets = (await client.get(f"http://127.0.0.1:{port}/json/list")).json()
            target = next(t for t in targets if t["type"] == "page")
        async with trio_websocket.open_websocket_url(
            target["webSocketDebuggerUrl"], max_message_size=64 * 1024 * 1024
        ) as ws:
            yield Page(ws)
    finally:
        with trio.CancelScope(shield=True):
            proc.terminate()
            with trio.move_on_after(10):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
