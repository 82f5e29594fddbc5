"""Logging for every command: `--log-level`, `--log-format text|json`, and the start-up line.

A person reads text; a log pipeline (Loki, Elasticsearch, `jq`) wants one JSON object per line
with fields it can filter on without parsing the message. So every command takes the same two
flags (`akri_trio.flaghelp.add_log_arguments`), and a line about one Configuration, Instance,
node or discovery handler carries them as fields
(`log.info(..., extra=fields(configuration=key))`): in JSON they are keys, in text they follow
the message as `key=value`. `setup_logging` can also stamp fields on every line of a process
(the agent's node). A bad `--log-level` is a usage error before anything starts, not a
`ValueError` from `logging` deep in start-up.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = [
    "FIELDS",
    "FORMATS",
    "LEVELS",
    "JsonFormatter",
    "TextFormatter",
    "fields",
    "log_format",
    "log_level",
    "log_startup",
    "setup_logging",
]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
# Record attributes that become fields, in this order; any other `extra=` is left out.
FIELDS = ("configuration", "instance", "node", "handler", "endpoint", "version", "settings")
_HANDLER_NAME = "akri-trio"
# Names of settings never printed at start-up, whatever a command passes.
_SECRET_WORDS = ("token", "password", "secret", "credential")


def log_level(text: str) -> str:
    """argparse `type=` for --log-level: a level name in any case, returned in upper case."""
    level = text.strip().upper()
    if level not in LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid level {text!r} (choose from {', '.join(LEVELS)}, any case)"
        )
    return level


def log_format(text: str) -> str:
    """argparse `type=` for --log-format: text or json, any case."""
    fmt = text.strip().lower()
    if fmt not in FORMATS:
        raise argparse.ArgumentTypeError(f"invalid format {text!r} (choose from text, json)")
    return fmt


def fields(**values: object) -> dict[str, str]:
    """`extra=` for a log call: the given fields as strings (an ObjectKey prints ns/name);
    None values are left out."""
    return {k: str(v) for k, v in values.items() if v is not None}


def _iso(created: float) -> str:
    stamp = dt.datetime.fromtimestamp(created, dt.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: getattr(record, k) for k in FIELDS if getattr(record, k, None) is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, RFC 3339), level, logger, message, the FIELDS the
    record carries, and `exception` (the traceback as text) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(_record_fields(record))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["stack"] = record.stack_info
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`; settings are printed as compact JSON."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        extra = _record_fields(record)
        if not extra:
            return line
        parts = [
            f"{k}={json.dumps(v, default=str, separators=(',', ':')) if k == 'settings' else v}"
            for k, v in extra.items()
        ]
        return f"{line} {' '.join(parts)}"


class _Defaults(logging.Filter):
    """Stamps fields on every record that does not carry them already."""

    def __init__(self, defaults: Mapping[str, str]) -> None:
        super().__init__()
        self.defaults = dict(defaults)

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.defaults.items():
            if getattr(record, key, None) is None:
                setattr(record, key, value)
        return True


def setup_logging(
    level: str,
    fmt: str,
    *,
    stream: TextIO | None = None,
    defaults: Mapping[str, str] | None = None,
) -> logging.Handler:
    """Give the root logger one handler writing `fmt` lines to `stream` (stderr), replacing the
    one an earlier call added; `defaults` are fields every line carries. Returns the handler."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    if defaults:
        handler.addFilter(_Defaults(defaults))
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _HANDLER_NAME:  # ours from an earlier call; others stay (pytest's)
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # One line per API request (httpx) or per HTTP/2 frame (hpack) is noise even at DEBUG.
    for noisy in ("httpx", "httpcore", "hpack"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    return handler


def version() -> str:
    # akri_trio.__version__ (not importlib.metadata's: see akri_trio/__init__.py), read from the
    # package Python imported before this module, as runtime/ imports nothing of akri_trio's.
    top: str = sys.modules[__name__.partition(".")[0]].__version__
    return top


def startup_settings(settings: Mapping[str, object]) -> dict[str, object]:
    """The settings worth a start-up line: plain values (paths as text), secrets left out."""
    out: dict[str, object] = {}
    for key, value in settings.items():
        if any(word in key.lower() for word in _SECRET_WORDS):
            continue
        if value is None or isinstance(value, bool | int | float | str):
            out[key] = value
        elif isinstance(value, list | tuple):
            out[key] = [str(v) for v in value]
        else:
            out[key] = str(value)
    return out


def log_startup(log: logging.Logger, command: str, settings: Mapping[str, object]) -> None:
    """One INFO line naming the command, the version and the effective settings."""
    shown = startup_settings(settings)
    log.info(
        "akri-trio %s %s starting",
        command,
        version(),
        extra={"version": version(), "settings": shown},
    )
