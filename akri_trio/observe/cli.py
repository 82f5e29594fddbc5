"""`akri-trio status`: what Akri is doing, for a terminal (also `kubectl akri status`).

Configurations -> each node's handlers and failing conditions -> Instances with every slot and
the Pod holding it -> brokers; `-o json` prints the same picture as JSON (every Configuration
and Instance by name), `--watch` redraws it on every change. Read-only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import trio

from akri_trio.flaghelp import Parser, add_kubeconfig_argument, add_log_arguments
from akri_trio.kube import Client, ConfigError, load_config
from akri_trio.observe.picture import render_text
from akri_trio.observe.watcher import ClusterWatch, fetch
from akri_trio.runtime.logs import setup_logging

CLEAR = "\x1b[H\x1b[2J"


def add_picture_arguments(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """--kubeconfig and -n: where the picture comes from (status and dashboard)."""
    add_kubeconfig_argument(p, env)
    p.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="only this namespace's Configurations and Instances (default: all namespaces)",
    )


def parse_status_args(argv: list[str], env: Mapping[str, str]) -> argparse.Namespace:
    p = Parser(
        prog="akri-trio status",
        description="Configurations, per-node conditions, Instances, slots and the Pods "
        "holding them, brokers.",
    )
    add_picture_arguments(p, env)
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text or json")
    p.add_argument("--watch", "-w", action="store_true", help="redraw on every change")
    add_log_arguments(p, env)
    return p.parse_args(argv)


def _emit(pic: Mapping[str, Any], output: str, out: TextIO, *, clear: bool) -> None:
    if output == "json":
        out.write(json.dumps(pic, sort_keys=True) + "\n")
    else:
        out.write((CLEAR if clear else "") + render_text(pic))
    out.flush()


async def status(args: argparse.Namespace, out: TextIO) -> None:
    async with Client.open(load_config(args.kubeconfig, context=args.context)) as api:
        if not args.watch:
            pic, notes = await fetch(api, args.namespace)
            _emit(pic, args.output, out, clear=False)
            for note in notes:
                print(note, file=sys.stderr)
            return
        watch = ClusterWatch(api, args.namespace)
        async with trio.open_nursery() as nursery:
            await nursery.start(watch.run)
            async for pic in watch.changes():
                _emit(pic, args.output, out, clear=out.isatty())


def status_main(argv: list[str]) -> int:
    args = parse_status_args(argv, os.environ)
    setup_logging(args.log_level, args.log_format)
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends --watch
            trio.run(status, args, sys.stdout)
    except ConfigError as exc:
        print(f"akri-trio status: {exc} (hint: --kubeconfig FILE or KUBECONFIG)", file=sys.stderr)
        return 1
    return 0


def kubectl_main() -> int:
    """`kubectl akri <command>`: kubectl finds `kubectl-akri` on PATH and passes the rest."""
    from akri_trio.cli import main

    return main(sys.argv[1:])
