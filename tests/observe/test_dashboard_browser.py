"""The dashboard in a real headless chromium: what a person sees, read from the page's DOM.

The live test runs the dashboard against the real API server, with an agent watching only the
test's namespace: a device appearing, then a slot being claimed, must show on the page within a
second of the change reaching the API server. The screenshot test needs no cluster.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import trio

from akri_trio.kube import Resource
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from akri_trio.observe.dashboard import Hub, run_dashboard
from akri_trio.observe.picture import picture
from tests.observe.conftest import (
    RunningAgent,
    Space,
    admit_user_pod,
    first_instance,
)
from tests.observe.test_dashboard import serve
from tests.support.akri_cluster import debug_echo_config
from tests.support.browser import Page, open_page
from tests.support.polling import until_api

PODS = Resource.core("pods", "Pod")
SHOWN_WITHIN_S = 1.0


def js(text: str) -> str:
    return json.dumps(text)


def element(attribute: str, value: str) -> str:
    """A JavaScript expression: the page's element whose `attribute` is `value`, or null."""
    return f"document.querySelector({js(f'[{attribute}={js(value)}]')})"


async def shown_within(page: Page, expression: str, limit_s: float) -> float:
    """Seconds until `expression` holds on the page; fails past `limit_s`."""
    start = trio.current_time()
    with trio.move_on_after(limit_s):
        await page.until(f"!!({expression})")  # an element comes back as {}: falsy here
        return trio.current_time() - start
    shown = await page.evaluate("document.body.innerText")
    raise AssertionError(f"not shown within {limit_s}s: {expression}\nthe page:\n{shown}")


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def test_screenshot_of_a_picture(tmp_path: Path) -> None:
    inst = {
        "metadata": {"namespace": "ns", "name": "cam-1a2b"},
        "spec": {
            "configurationName": "cams",
            "capacity": 2,
            "nodes": ["n1"],
            "deviceUsage": {"cam-1a2b-0": "", "cam-1a2b-1": "n1"},
        },
    }
    pod = {
        "metadata": {"namespace": "ns", "name": "user"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"limits": {"akri.sh/cam-1a2b": "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    config = {
        "metadata": {"namespace": "ns", "name": "cams"},
        "spec": {"discoveryHandler": {"name": "debugEcho"}, "capacity": 2},
    }
    hub = Hub(picture([config], [inst], [pod], nodes=[{"metadata": {"name": "n1"}}]))
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, hub)
        with trio.fail_after(60):
            async with open_page(tmp_path / "chrome", width=1000, height=700) as page:
                await page.goto(f"http://127.0.0.1:{port}/")
                slot = element("data-slot", "cam-1a2b-1")
                await page.until(f"{slot} && {slot}.dataset.state === 'claimed'")
                text = await page.evaluate(f"{slot}.textContent")
                assert "n1" in text and "ns/user" in text
                free = await page.evaluate(element("data-slot", "cam-1a2b-0") + ".dataset.state")
                assert free == "free"
                shot = await page.screenshot()
        nursery.cancel_scope.cancel()
    width, height = png_size(shot)
    assert width == 1000 and 300 < height <= 700  # the viewport: the window less its frame
    assert 5_000 < len(shot) < 5_000_000  # a rendered page, not a blank or broken image
    (tmp_path / "dashboard.png").write_bytes(shot)


@pytest.mark.k8s
async def test_page_shows_a_device_appearing_and_a_slot_claimed_within_a_second(
    space: Space, agent: RunningAgent, short_tmp: Path
) -> None:
    api, ns = space.api, space.name
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            port = await nursery.start(run_dashboard, api, ns, "127.0.0.1", 0)
        async with open_page(short_tmp / "chrome") as page:
            with trio.fail_after(30):
                await page.goto(f"http://127.0.0.1:{port}/")
                await page.until("document.getElementById('conn').textContent === 'live'")
            await api.create(CONFIGURATIONS, debug_echo_config("cams", ns, ["cam0"], capacity=2))

            inst = await until_api(lambda: first_instance(space), 20)
            name = inst["metadata"]["name"]
            box = element("data-instance", f"{ns}/{name}")
            took = await shown_within(page, box, SHOWN_WITHIN_S)
            print(f"Instance shown {took:.3f}s after the API server had it")

            with trio.fail_after(20):
                await trio.to_thread.run_sync(
                    agent.kubelet.wait_for,
                    lambda k: len(k.healthy(f"akri.sh/{name}")) == 2,
                    20.0,
                )
            await trio.to_thread.run_sync(
                agent.kubelet.allocate, f"akri.sh/{name}", [[f"{name}-1"]]
            )

            async def claimed() -> bool:
                obj = await api.get(INSTANCES, name, namespace=ns)
                return bool(obj["spec"].get("deviceUsage", {}).get(f"{name}-1"))

            await until_api(claimed, 20)
            slot = element("data-slot", f"{name}-1")
            took = await shown_within(
                page, f"{slot} && {slot}.dataset.state === 'claimed'", SHOWN_WITHIN_S
            )
            print(f"claim shown {took:.3f}s after the API server had it")
            assert await page.evaluate(f"{slot}.dataset.node") == agent.node

            await admit_user_pod(space, agent.node, f"akri.sh/{name}")
            await shown_within(page, f"{slot}.dataset.pods === {js(f'{ns}/user')}", 10)
            free = element("data-slot", f"{name}-0") + ".dataset.state"
            assert await page.evaluate(free) == "free"
            seen_by = await page.evaluate(f"{box}.textContent")
            assert f"seen by {agent.node}" in seen_by
            png_size(await page.screenshot())
        nursery.cancel_scope.cancel()
