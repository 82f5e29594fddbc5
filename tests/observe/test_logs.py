"""Logs: the JSON and text formatters, the flags every command takes, the start-up line."""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys

import pytest

from akri_trio.address import ObjectKey
from akri_trio.agent.cli import parse_args as agent_args
from akri_trio.discovery.cli import build_parser as handler_parser
from akri_trio.flaghelp import Parser, add_log_arguments
from akri_trio.observe.cli import parse_status_args
from akri_trio.runtime.logs import (
    JsonFormatter,
    TextFormatter,
    fields,
    log_startup,
    setup_logging,
    startup_settings,
    version,
)
from akri_trio.webhook.cli import parse_serve_args


def record(
    msg: str, *args: object, level: int = logging.INFO, **extra: object
) -> logging.LogRecord:
    rec = logging.LogRecord("akri_trio.agent.x", level, __file__, 1, msg, args, None)
    rec.created = 1_700_000_000.25
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_json_line_has_the_fixed_keys_then_the_fields() -> None:
    rec = record("applied Instance %s", "ns/i")
    rec.__dict__.update(fields(instance=ObjectKey("ns", "i"), configuration="ns/c", node=None))
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    obj = json.loads(line)
    assert obj == {
        "time": "2023-11-14T22:13:20.250Z",
        "level": "INFO",
        "logger": "akri_trio.agent.x",
        "message": "applied Instance ns/i",
        "configuration": "ns/c",
        "instance": "ns/i",
    }
    assert list(obj)[:4] == ["time", "level", "logger", "message"]


def test_json_line_carries_the_traceback_and_stays_one_line() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        rec = record("failed", level=logging.ERROR)
        rec.exc_info = sys.exc_info()
    line = JsonFormatter().format(rec)
    assert line.count("\n") == 0
    obj = json.loads(line)
    assert obj["level"] == "ERROR" and "ValueError: bad" in obj["exception"]


def test_unknown_extras_are_left_out() -> None:
    obj = json.loads(JsonFormatter().format(record("m", secret_thing="x", handler="udev")))
    assert obj["handler"] == "udev" and "secret_thing" not in obj


def test_text_line_appends_fields() -> None:
    line = TextFormatter().format(record("lost %s", "x", configuration="ns/c", handler="udev"))
    assert line.endswith(" INFO akri_trio.agent.x: lost x configuration=ns/c handler=udev")
    assert TextFormatter().format(record("plain")).endswith("akri_trio.agent.x: plain")


def parser(env: dict[str, str] | None = None) -> argparse.ArgumentParser:
    p = Parser(prog="t")
    add_log_arguments(p, env or {})
    return p


@pytest.mark.parametrize("given", ["debug", "Info", "WARNING", " error "])
def test_log_level_any_case(given: str) -> None:
    assert parser().parse_args(["--log-level", given]).log_level == given.strip().upper()


def test_log_defaults_and_env() -> None:
    args = parser().parse_args([])
    assert (args.log_level, args.log_format) == ("INFO", "text")
    env = {"AKRI_LOG_LEVEL": "warning", "AKRI_LOG_FORMAT": "JSON"}
    args = parser(env).parse_args([])
    assert (args.log_level, args.log_format) == ("WARNING", "json")
    assert "env AKRI_LOG_LEVEL" in " ".join(parser().format_help().split())


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--log-level", "verbose"], {}),
        (["--log-level", "critical"], {}),
        (["--log-format", "yaml"], {}),
        ([], {"AKRI_LOG_LEVEL": "loud"}),
    ],
)
def test_bad_values_are_a_one_line_usage_error(
    argv: list[str], env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        parser(env).parse_args(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("usage: ") and len(err) == 2 and "invalid" in err[1]


def test_every_command_takes_the_flags() -> None:
    flags = ["--log-level", "debug", "--log-format", "json"]
    assert agent_args(flags, {"AGENT_NODE_NAME": "n"}) is not None
    assert handler_parser({}).parse_args(["debugEcho", *flags]).log_format == "json"
    tls = ["--tls-cert-file", "c", "--tls-key-file", "k"]
    assert parse_serve_args([*tls, *flags]).log_level == "DEBUG"
    assert parse_status_args(flags, {}).log_format == "json"
    with pytest.raises(SystemExit):
        agent_args(["--log-level", "nope"], {"AGENT_NODE_NAME": "n"})


def test_startup_line_names_version_and_settings_without_secrets() -> None:
    out = io.StringIO()
    handler = setup_logging("INFO", "json", stream=out, defaults={"node": "n1"})
    try:
        log_startup(
            logging.getLogger("akri_trio.test"),
            "agent",
            {"port": 8080, "kubeconfig": None, "api_token": "hunter2", "dirs": ("a", "b")},
        )
    finally:
        logging.getLogger().removeHandler(handler)
    (line,) = out.getvalue().splitlines()
    obj = json.loads(line)
    assert obj["message"] == f"akri-trio agent {version()} starting"
    assert obj["node"] == "n1" and obj["version"] == version()
    assert obj["settings"] == {"port": 8080, "kubeconfig": None, "dirs": ["a", "b"]}
    assert "hunter2" not in line


def test_startup_settings_print_paths_as_text() -> None:
    from pathlib import Path

    assert startup_settings({"dir": Path("/x"), "password": "p"}) == {"dir": "/x"}


def test_setup_logging_replaces_only_its_own_handler() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    first = setup_logging("DEBUG", "text", stream=io.StringIO())
    second = setup_logging("WARNING", "json", stream=io.StringIO())
    try:
        assert first not in root.handlers and second in root.handlers
        assert [h for h in root.handlers if h is not second] == before
        assert logging.getLogger("httpx").level == logging.WARNING
    finally:
        root.removeHandler(second)
