"""bench/_scheduler.py: the bench's scheduler's configuration, and what a phase cost it, read
from two scrapes of its metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench._scheduler import SCHEDULER_NAME, Cost, Limits, parse_metrics, scheduler_config, since

BEFORE = """\
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="akri-bench-storm",result="scheduled"} 3
# TYPE rest_client_requests_total counter
rest_client_requests_total{code="201",host="127.0.0.1:16443",method="POST"} 10
rest_client_requests_total{code="200",host="127.0.0.1:16443",method="GET"} 40
# TYPE rest_client_rate_limiter_duration_seconds histogram
rest_client_rate_limiter_duration_seconds_sum{host="127.0.0.1:16443",verb="POST"} 0.5
rest_client_rate_limiter_duration_seconds_count{host="127.0.0.1:16443",verb="POST"} 10
"""
POINTS = "scheduler_framework_extension_point_duration_seconds"
AFTER = f"""\
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{{profile="akri-bench-storm",result="scheduled"}} 5
scheduler_schedule_attempts_total{{profile="akri-bench-storm",result="unschedulable"}} 1
# TYPE {POINTS} histogram
{POINTS}_sum{{extension_point="PreBind",status="Success"}} 0.3
{POINTS}_sum{{extension_point="PreBind",status="Error"}} 0.1
# TYPE rest_client_requests_total counter
rest_client_requests_total{{code="201",host="127.0.0.1:16443",method="POST"}} 16
rest_client_requests_total{{code="200",host="127.0.0.1:16443",method="PUT"}} 4
rest_client_requests_total{{code="200",host="127.0.0.1:16443",method="GET"}} 90
# TYPE rest_client_rate_limiter_duration_seconds histogram
rest_client_rate_limiter_duration_seconds_sum{{host="127.0.0.1:16443",verb="POST"}} 2.5
rest_client_rate_limiter_duration_seconds_count{{host="127.0.0.1:16443",verb="POST"}} 16
rest_client_rate_limiter_duration_seconds_sum{{host="127.0.0.1:16443",verb="PUT"}} 1.0
rest_client_rate_limiter_duration_seconds_count{{host="127.0.0.1:16443",verb="PUT"}} 4
"""


def test_cost_counts_what_the_phase_added_between_two_scrapes() -> None:
    cost = Cost.of(2, since(parse_metrics(BEFORE), parse_metrics(AFTER)))
    assert cost.attempts == {"scheduled": 2, "unschedulable": 1}
    assert cost.points_s["PreBind"] == pytest.approx(0.4)  # every status summed
    assert cost.points_s["Bind"] == 0
    assert cost.limiter_s == 3.0 and cost.limited == 10
    assert cost.writes == 10  # POST and PUT; GETs are no writes
    assert "scheduler writes per Pod 5.0" in cost.line()


def test_limits_parse_as_written_and_reach_the_configuration() -> None:
    limits = Limits.parse("500/1000")
    assert (limits.qps, limits.burst, str(limits)) == (500, 1000, "500/1000")
    config = json.loads(scheduler_config(Path("/k/scheduler.kubeconfig"), limits))
    assert config["clientConnection"] == {
        "kubeconfig": "/k/scheduler.kubeconfig",
        "qps": 500,
        "burst": 1000,
    }
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["profiles"] == [{"schedulerName": SCHEDULER_NAME}]
