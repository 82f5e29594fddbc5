"""The event loop's lag (akri_trio.observe.lag): the pure verdict, the sampler under the mock
clock, and a real stall seen by /healthz and `akri_event_loop_lag_seconds` over a real socket."""

from __future__ import annotations

import functools
import time

import httpx
import pytest
import trio
import trio.testing

from akri_trio.observe.endpoints import serve_observe
from akri_trio.observe.lag import LagMonitor, current_lag, verdict
from akri_trio.observe.metrics import event_loop_lag, new_registry
from tests.support.polling import until_api

HOST = "127.0.0.1"


def test_the_lag_is_the_last_sample_or_how_overdue_the_running_sleep_is() -> None:
    assert current_lag(0.0, None, 10.0) == 0.0
    assert current_lag(0.3, 10.0, 9.5) == 0.3  # the sleep is not due yet
    assert current_lag(0.0, 10.0, 12.5) == 2.5  # a stall now: the sampler has not run yet
    assert current_lag(0.3, 10.0, 10.1) == 0.3


def test_verdict() -> None:
    assert verdict(0.25, 0.5) == (True, "ok (event loop lag 0.250s)")
    assert verdict(0.75, 0.5) == (False, "event loop lag 0.750s is over 0.5s")


async def test_the_sampler_records_how_late_it_woke(
    autojump_clock: trio.testing.MockClock,
) -> None:
    samples: list[float] = []
    monitor = LagMonitor(1.0, samples.append, period=0.1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor.run)
        await trio.sleep(0.35)
        assert samples == [0.0, 0.0, 0.0]
        # Time passing without any task running is what a stalled loop looks like.
        autojump_clock.jump(2.0)
        assert monitor.check() == (False, "event loop lag 1.950s is over 1s")
        await trio.sleep(0.01)
        assert samples[-1] == pytest.approx(1.95)
        await trio.sleep(0.2)
        assert monitor.check()[0] and monitor.peak == pytest.approx(1.95)
        nursery.cancel_scope.cancel()


async def test_a_blocking_call_fails_healthz_and_shows_in_the_metric_until_recovered() -> None:
    registry = new_registry(process=False)
    # sampled more often than the stall lasts, so the stall always spans a wake-up
    monitor = LagMonitor(0.2, event_loop_lag(registry).observe, period=0.1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor.run)
        port = await nursery.start(
            functools.partial(serve_observe, HOST, 0, registry=registry, live=monitor.check)
        )
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}") as http:

            async def healthy() -> bool:
                return (await http.get("/healthz")).status_code == 200

            with trio.fail_after(60):
                await until_api(healthy, what="healthy before the stall")
                time.sleep(0.5)  # noqa: ASYNC251  (the stall: a blocking call in the loop)
                stalled = await http.get("/healthz")
                assert stalled.status_code == 503
                assert stalled.text.startswith("event loop lag ")
                assert stalled.text.endswith("s is over 0.2s\n")
                metrics = (await http.get("/metrics")).text
                count = _sample(metrics, "akri_event_loop_lag_seconds_count")
                under = _sample(metrics, 'akri_event_loop_lag_seconds_bucket{le="0.25"}')
                assert count - under >= 1  # a sample of more than 0.25 s
                await until_api(healthy, what="healthy again after the stall")
        nursery.cancel_scope.cancel()


def _sample(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[-1])
