"""A running agent's /metrics on the real API server: upstream's names and labels, and ours."""

from __future__ import annotations

import httpx
import pytest

from akri_trio.model.resources import CONFIGURATIONS
from tests.observe.conftest import RunningAgent, Space
from tests.support.akri_cluster import debug_echo_config
from tests.support.polling import until_api

pytestmark = pytest.mark.k8s


async def test_agent_exports_upstream_compatible_metrics(space: Space, agent: RunningAgent) -> None:
    await space.api.create(CONFIGURATIONS, debug_echo_config("seen", space.name, ["s0", "s1"]))
    port = agent.agent.metrics_port
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

        async def scraped() -> str | None:
            text = (await http.get("/metrics")).text
            wanted = (
                f'akri_instance_count{{configuration="seen",is_shared="true",'
                f'namespace="{space.name}"}} 2.0'
            )
            return text if wanted in text else None

        text = await until_api(scraped, 20)
    assert (
        'akri_discovery_response_result{discovery_handler_name="debugEcho",result="Success"}'
        in text
    )
    assert 'akri_discovery_response_time_count{configuration="seen"} 1.0' in text
    assert 'state="free"} 2.0' in text and "akri_instance_slots{" in text
    assert 'akri_reconcile_queue_depth{controller="configurations"}' in text
    assert "akri_device_plugins_registered" in text
    assert "process_resident_memory_bytes" in text
    assert "_created" not in text
