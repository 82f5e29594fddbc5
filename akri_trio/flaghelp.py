"""Command-line flags whose `--help` says where each value comes from: env var and default.

Every `akri-trio` command builds its parser as a `Parser`. A flag that can also be set through
the environment (upstream's manifests set AGENT_NODE_NAME, METRICS_PORT, ...) is added with
`add_env_argument`, which reads the variable once as the flag's default and marks the action
with its name. `FlagHelp`, the parsers' formatter, then ends each flag's help with what it is
missing of "(env VAR; default X)", so the help cannot drift from the code: the default shown
is the one in the code, the variable the one that is read.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from akri_trio.runtime.logs import LEVELS, log_format, log_level

# Set on actions added by add_env_argument (argparse keeps unknown attributes).
ENV_VAR: Final = "akri_env_var"
BUILTIN_DEFAULT: Final = "akri_builtin_default"

KUBECONFIG_HELP: Final = (
    "kube config file (default: the in-cluster service account, else ~/.kube/config, as kubectl)"
)
# A help string that ends by saying its default (or that it is required) in its own words.
_OWN_DEFAULT: Final = re.compile(r"(?s)(.*)\(((?:default|required)\b[^()]*)\)")


def env_var(action: argparse.Action) -> str | None:
    """The environment variable an action's default is read from, if any."""
    value = getattr(action, ENV_VAR, None)
    return value if isinstance(value, str) else None


def describe_default(action: argparse.Action) -> str:
    """The code's default of a flag in words (not one the environment supplied)."""
    default = getattr(action, BUILTIN_DEFAULT, action.default)
    if isinstance(default, bool):
        return "on" if default else "off"
    if default is None or (isinstance(default, list | tuple) and not default):
        return "none"
    if isinstance(default, float):
        return f"{default:g}"
    if isinstance(default, list | tuple):
        return ",".join(str(item) for item in default)
    return str(default)


class FlagHelp(argparse.HelpFormatter):
    """Appends "(env VAR; default X)" — or "required" — to each flag's help, leaving out what
    the help already says in its own words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or action.help == argparse.SUPPRESS:
            return action.help
        if action.default == argparse.SUPPRESS:  # --help, --version
            return action.help
        notes = []
        var = env_var(action)
        if var is not None and f"env {var}" not in text:
            notes.append(f"env {var}")
        if action.required:
            if "required" not in text:
                notes.append("required")
        elif "default" not in text and "required" not in text:
            # Help strings are %-formatted (%(default)s): a literal % must be doubled.
            notes.append("default " + describe_default(action).replace("%", "%%"))
        if not notes:
            return text
        own = _OWN_DEFAULT.fullmatch(text)
        if own is not None:  # "... (default: all namespaces)" -> "... (env X; default: all ...)"
            return f"{own[1]}({'; '.join(notes)}; {own[2]})"
        return f"{text} ({'; '.join(notes)})" if text else "; ".join(notes)

    def shown(self, action: argparse.Action) -> argparse.Action:
        """The action as help shows it: argparse prints nothing for a flag without help, so
        such a flag gets its notes as its help."""
        if not action.option_strings or action.help is not None:
            return action
        with_notes = copy.copy(action)
        with_notes.help = self._get_help_string(action)
        return with_notes

    def _format_action(self, action: argparse.Action) -> str:
        return super()._format_action(self.shown(action))


class Parser(argparse.ArgumentParser):
    """An ArgumentParser with FlagHelp; its subparsers are Parsers too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", FlagHelp)
        super().__init__(*args, **kwargs)


def add_env_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *names: str,
    env: Mapping[str, str],
    var: str,
    default: Any = None,
    from_env: Callable[[str], Any] | None = None,
    **kwargs: Any,
) -> argparse.Action:
    """`parser.add_argument(*names, **kwargs)` with its default read from `env[var]` when that
    is set and not blank, else `default`. The text goes through `from_env` when given (a
    boolean, a list); otherwise argparse converts it with the flag's `type` when it is used,
    so a bad value in the environment is reported like a bad flag."""
    raw = env.get(var, "")
    value = default
    if raw.strip():
        value = from_env(raw) if from_env is not None else raw
    action = parser.add_argument(*names, default=value, **kwargs)
    setattr(action, ENV_VAR, var)
    setattr(action, BUILTIN_DEFAULT, default)
    return action


def add_kubeconfig_argument(
    parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None
) -> argparse.Action:
    """--kubeconfig and --context, for every command that talks to the API server. KUBECONFIG
    itself is read by `load_config` when the flag is not given (it may list several files);
    the context's variable is named as helm names its own (HELM_KUBECONTEXT)."""
    action = parser.add_argument("--kubeconfig", type=Path, default=None, help=KUBECONFIG_HELP)
    setattr(action, ENV_VAR, "KUBECONFIG")
    add_env_argument(
        parser,
        "--context",
        env=os.environ if env is None else env,
        var="AKRI_KUBECONTEXT",
        metavar="NAME",
        help="the kubeconfig context to use (default: its current-context)",
    )
    return action


def add_log_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """--log-level (env AKRI_LOG_LEVEL, default INFO) and --log-format (env AKRI_LOG_FORMAT,
    default text). A bad value from the environment is reported like a bad flag."""
    # argparse applies `type` to a string default, so a value from the env is checked too.
    add_env_argument(
        parser,
        "--log-level",
        env=env,
        var="AKRI_LOG_LEVEL",
        default="INFO",
        type=log_level,
        metavar="LEVEL",
        help=f"{', '.join(LEVELS)} (any case)",
    )
    add_env_argument(
        parser,
        "--log-format",
        env=env,
        var="AKRI_LOG_FORMAT",
        default="text",
        type=log_format,
        metavar="{text,json}",
        help="text for people, json for one object per line",
    )


def truthy(text: str) -> bool:
    """An environment boolean as upstream's manifests write them."""
    return text.strip().lower() in ("1", "true", "yes", "on")


def comma_list(text: str) -> list[str]:
    """`a,b,c` -> ["a", "b", "c"] (blanks dropped)."""
    return [item.strip() for item in text.split(",") if item.strip()]


def flag_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each flag of `parser` (by its longest option string) -> its help as --help prints it,
    unwrapped. For tests and docs."""
    formatter = parser._get_formatter()
    out: dict[str, str] = {}
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if isinstance(formatter, FlagHelp):
            action = formatter.shown(action)
        text = formatter._expand_help(action) if action.help else ""
        out[max(action.option_strings, key=len)] = " ".join(text.split())
    return out


def subparsers(parser: argparse.ArgumentParser) -> Sequence[argparse.ArgumentParser]:
    """The parsers of `parser`'s subcommands (none when it has no subcommands)."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.extend(dict.fromkeys(action.choices.values()))
    return found
