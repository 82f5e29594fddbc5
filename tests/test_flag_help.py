"""Every flag of every `akri-trio` command (and of `python -m akri_trio_dev cluster`) says in --help
where its value comes from: the env var it reads (if any) and its default (or that it is required)
— akri_trio.flaghelp.

The walk runs each command's real entry point with --help, keeps the parsers it built (and
their subcommands'), and checks what --help printed; meanwhile os.environ records every
variable read, so a flag that reads the environment without declaring it fails here."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from akri_trio import cli
from akri_trio.flaghelp import (
    Parser,
    add_env_argument,
    comma_list,
    describe_default,
    env_var,
    flag_helps,
    subparsers,
    truthy,
)
from akri_trio_dev import cli as dev_cli

COMMANDS = [
    ["agent"],
    ["controller"],
    ["webhook"],
    ["webhook", "certs"],
    ["discovery-handler"],
    ["status"],
    ["dashboard"],
    ["teardown"],
]
# The development tools' command line (python -m akri_trio_dev) keeps the same promise.
WALKS = [(cli.main, argv) for argv in COMMANDS] + [(dev_cli.main, ["cluster"])]


def test_every_command_is_walked() -> None:
    assert {argv[0] for argv in COMMANDS} == set(cli.SUBCOMMANDS)


class RecordingEnv(dict[str, str]):
    """os.environ's stand-in: the same values, and the names akri_trio's own code read (not
    argparse's COLUMNS or gettext's LANG)."""

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def _note(self, key: object) -> None:
        caller = sys._getframe(2).f_globals.get("__name__", "")
        if isinstance(key, str) and caller.startswith("akri_trio"):
            self.read.add(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)


def all_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for sub in subparsers(parser):
        yield from all_parsers(sub)


def squeeze(text: str) -> str:
    """Without white space: --help wraps lines, also after a hyphen."""
    return "".join(text.split())


@pytest.mark.parametrize(("main", "argv"), WALKS, ids=[" ".join(argv) for _, argv in WALKS])
def test_every_flag_names_its_default_and_env_var(
    main: Callable[[list[str]], int],
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for module_function, _ in cli.SUBCOMMANDS.values():  # imports read no flags
        importlib.import_module(module_function.partition(":")[0])
    built: list[argparse.ArgumentParser] = []
    parse_args = Parser.parse_args

    def keep(self: Parser, *args: Any, **kwargs: Any) -> Any:
        built.append(self)
        return parse_args(self, *args, **kwargs)

    monkeypatch.setattr(Parser, "parse_args", keep)
    env = RecordingEnv(dict(os.environ))
    monkeypatch.setattr(os, "environ", env)
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    printed = squeeze(capsys.readouterr().out)
    assert built, "the command built no flaghelp.Parser"

    declared: set[str] = set()
    for parser in (p for top in built for p in all_parsers(top)):
        helps = flag_helps(parser)
        shown = squeeze(parser.format_help())
        for action in parser._actions:
            if not action.option_strings or action.default == argparse.SUPPRESS:
                continue  # positionals, --help
            name = max(action.option_strings, key=len)
            text = helps[name]
            assert "default" in text or "required" in text, f"{name}: {text!r}"
            var = env_var(action)
            if var is not None:
                declared.add(var)
                assert f"env {var}" in text, f"{name}: {text!r}"
            assert squeeze(text) in shown, f"{name}: {text!r} is not what --help shows"
    assert any(squeeze(p.format_help()) == printed for p in built)  # what the user saw
    # A flag's default read from the environment without saying so would show up here.
    assert env.read <= declared, f"read but no flag names them: {sorted(env.read - declared)}"


def parser_with(env: dict[str, str]) -> Parser:
    p = Parser(prog="t")
    add_env_argument(p, "--port", env=env, var="T_PORT", type=int, default=8080, help="a port")
    add_env_argument(
        p, "--on", env=env, var="T_ON", from_env=truthy, action="store_true", default=False
    )
    add_env_argument(
        p, "--item", env=env, var="T_ITEMS", from_env=comma_list, action="append", default=[]
    )
    p.add_argument("--share", type=float, default=0.5, help="in %% of the whole")
    p.add_argument("--dir", type=Path, default=Path("/var/lib/akri"))
    p.add_argument("--name", required=True)
    return p


def test_env_supplies_the_default_and_help_shows_the_codes() -> None:
    env = {"T_PORT": "9000", "T_ON": "true", "T_ITEMS": "udev, opcua,"}
    args = parser_with(env).parse_args(["--name", "n"])
    assert (args.port, args.on, args.item) == (9000, True, ["udev", "opcua"])
    assert parser_with({}).parse_args(["--name", "n"]).port == 8080
    assert parser_with({"T_PORT": "  "}).parse_args(["--name", "n"]).port == 8080  # blank: unset
    assert parser_with(env).parse_args(["--name", "n", "--port", "1"]).port == 1  # the flag wins
    helps = flag_helps(parser_with(env))
    assert helps["--port"] == "a port (env T_PORT; default 8080)"  # the code's, not the env's
    assert helps["--on"] == "env T_ON; default off"
    assert helps["--item"] == "env T_ITEMS; default none"
    assert helps["--share"] == "in % of the whole (default 0.5)"
    assert helps["--dir"] == "default /var/lib/akri"
    assert helps["--name"] == "required"


def test_a_bad_value_in_the_environment_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        parser_with({"T_PORT": "eighty"}).parse_args(["--name", "n"])
    assert exited.value.code == 2
    assert "argument --port: invalid int value: 'eighty'" in capsys.readouterr().err


def test_help_that_says_it_in_its_own_words_is_left_alone() -> None:
    p = Parser(prog="t")
    add_env_argument(p, "--ns", env={}, var="T_NS", help="only this one (default: all)")
    add_env_argument(p, "--node", env={}, var="T_NODE", help="the node (required)")
    p.add_argument("--x", default="50%", help="x (env T_X; default 50%%)")
    assert flag_helps(p) == {
        "--help": "show this help message and exit",
        "--ns": "only this one (env T_NS; default: all)",
        "--node": "the node (env T_NODE; required)",
        "--x": "x (env T_X; default 50%)",
    }


@pytest.mark.parametrize(
    ("default", "words"),
    [
        (None, "none"),
        ([], "none"),
        (True, "on"),
        (False, "off"),
        (120.0, "120"),
        (["a", "b"], "a,b"),
    ],
)
def test_describe_default(default: object, words: str) -> None:
    action = argparse.ArgumentParser().add_argument("--f", default=default)
    assert describe_default(action) == words
