"""`akri-trio teardown`: delete every Configuration and wait until their Instances are gone.

An uninstall that removed the agents first would strand what they own: Instances keep the
agents' finalizers and the kubelet keeps advertising resources nobody serves. So the Helm
chart runs this as a pre-delete hook, while the agents and the controller still run: the
Configurations go, the garbage collector takes their Instances (owned by them), each agent
releases its plugins and finalizers, the controller's brokers and Services follow their
Instances, and only then does Helm delete the workloads. It exits non-zero when something is
still there after `--timeout`, so the uninstall says so instead of leaving it silently.
`--namespace` (repeatable) limits it to those namespaces, for an installation whose agents
watch only them; by default every namespace, as upstream's hook does.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Sequence

import trio

from akri_trio.flaghelp import Parser, add_kubeconfig_argument
from akri_trio.kube import JSON, Client, KubeConfig, NotFound, Resource, load_config
from akri_trio.model.resources import CONFIGURATIONS, INSTANCES
from akri_trio.shutdown import run_until_signalled

log = logging.getLogger("akri_trio.teardown")

POLL_S = 1.0


ALL_NAMESPACES: tuple[str | None, ...] = (None,)


async def _items(client: Client, res: Resource, namespaces: Sequence[str | None]) -> list[JSON]:
    return [obj for ns in namespaces for obj in (await client.list(res, namespace=ns)).items]


async def remaining(
    client: Client, namespaces: Sequence[str | None] = ALL_NAMESPACES
) -> tuple[int, int]:
    """How many Configurations and Instances exist in `namespaces` (None: all of them)."""
    configurations = await _items(client, CONFIGURATIONS, namespaces)
    instances = await _items(client, INSTANCES, namespaces)
    return len(configurations), len(instances)


async def teardown(client: Client, namespaces: Sequence[str | None] = ALL_NAMESPACES) -> None:
    """Delete every Configuration in `namespaces`, then return once none and no Instance is
    left there.

    No timeout here: the caller bounds it. Configurations made meanwhile are deleted too."""
    while True:
        configurations = await _items(client, CONFIGURATIONS, namespaces)
        for obj in configurations:
            meta = obj["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            try:
                await client.delete(CONFIGURATIONS, meta["name"], namespace=meta["namespace"])
            except NotFound:
                continue
            log.info("deleted Configuration %s/%s", meta["namespace"], meta["name"])
        left = await remaining(client, namespaces)
        if left == (0, 0):
            return
        log.info("waiting: %d Configurations, %d Instances left", *left)
        await trio.sleep(POLL_S)


async def _main(config: KubeConfig, bound_s: float, namespaces: Sequence[str | None]) -> int:
    async with Client.open(config) as client:
        with trio.move_on_after(bound_s):
            await teardown(client, namespaces)
            log.info("no Configuration and no Instance left")
            return 0
        configurations, instances = await remaining(client, namespaces)
        log.error(
            "after %.0f s still %d Configurations and %d Instances",
            bound_s,
            configurations,
            instances,
        )
        return 1


def main(argv: list[str]) -> int:
    p = Parser(prog="akri-trio teardown", description=__doc__.splitlines()[0])
    add_kubeconfig_argument(p)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait")
    p.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        default=[],
        help="only this namespace (repeatable; default: all namespaces)",
    )
    args = p.parse_args(argv)
    namespaces: tuple[str | None, ...] = tuple(args.namespaces) or ALL_NAMESPACES
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    result: list[int] = [1]
    config = load_config(args.kubeconfig, context=args.context)

    async def run() -> None:
        result[0] = await _main(config, args.timeout, namespaces)

    trio.run(functools.partial(run_until_signalled, run, log))
    return result[0]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
