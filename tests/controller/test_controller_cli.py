"""`akri-trio controller`'s flags for its health and metrics server's connection cap."""

from __future__ import annotations

import pytest

from akri_trio.controller.cli import parse_args
from akri_trio.runtime.http import DEFAULT_MAX_CONNECTIONS


def test_metrics_max_connections_from_the_flag_the_env_or_the_default() -> None:
    assert parse_args([], {}).metrics_max_connections == DEFAULT_MAX_CONNECTIONS
    assert parse_args(["--metrics-max-connections", "9"], {}).metrics_max_connections == 9
    from_env = parse_args([], {"METRICS_MAX_CONNECTIONS": "5"})
    assert from_env.metrics_max_connections == 5


def test_a_cap_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--metrics-max-connections", "0"], {})
    assert "--metrics-max-connections must be at least 1" in capsys.readouterr().err
