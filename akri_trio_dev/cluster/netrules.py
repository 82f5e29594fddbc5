"""The iptables rules that give each extra node its own link to the API server, as argv lists.

The API server listens on 127.0.0.1 only. An extra node 127.0.0.<n> reaches it at its own
address (`NodeLayout.apiserver_url`): a NAT rule in the host's OUTPUT path sends
127.0.0.<n>:<port> to 127.0.0.1:<port>. Everything of that node that talks to the control plane
(its kubelet, an agent given the node's kubeconfig, its host-network Pods) does so through that
address, so `node partition` can cut exactly that node: a DROP in the raw table, which sees
packets before NAT, for the node's API address and its kubelet port (the API server's way in
for logs and exec). Dropping, not rejecting: a lost link is silence, as between real machines.

Each set of rules lives in a chain of ours, jumped to from OUTPUT once, so adding a rule twice
is avoided by checking (`-C`) first and removing them never touches another tool's rules.
"""

from __future__ import annotations

import attrs

NAT_CHAIN = "AKRI-TRIO-NODES"
PARTITION_CHAIN = "AKRI-TRIO-PARTITION"


@attrs.frozen
class Rule:
    """One rule of ours: `table`, `chain` and the match-and-target `spec`."""

    table: str
    chain: str
    spec: tuple[str, ...]

    def check(self) -> list[str]:
        return ["iptables", "-w", "-t", self.table, "-C", self.chain, *self.spec]

    def append(self) -> list[str]:
        return ["iptables", "-w", "-t", self.table, "-A", self.chain, *self.spec]

    def delete(self) -> list[str]:
        return ["iptables", "-w", "-t", self.table, "-D", self.chain, *self.spec]


@attrs.frozen
class Chain:
    """A chain of ours and the OUTPUT rule that jumps to it."""

    table: str
    name: str

    def create(self) -> list[str]:
        return ["iptables", "-w", "-t", self.table, "-N", self.name]

    @property
    def jump(self) -> Rule:
        return Rule(self.table, "OUTPUT", ("-j", self.name))

    def flush(self) -> list[str]:
        return ["iptables", "-w", "-t", self.table, "-F", self.name]

    def remove(self) -> list[str]:
        return ["iptables", "-w", "-t", self.table, "-X", self.name]


NAT = Chain("nat", NAT_CHAIN)
PARTITION = Chain("raw", PARTITION_CHAIN)
CHAINS = (NAT, PARTITION)


def api_link(address: str, apiserver_port: int) -> Rule:
    """127.0.0.<n>:<port> -> 127.0.0.1:<port>: the node's way to the API server."""
    return Rule(
        NAT.table,
        NAT.name,
        (
            "-d",
            f"{address}/32",
            "-p",
            "tcp",
            "--dport",
            str(apiserver_port),
            "-j",
            "DNAT",
            "--to-destination",
            f"127.0.0.1:{apiserver_port}",
        ),
    )


def partition(address: str, apiserver_port: int, kubelet_port: int) -> Rule:
    """Silence between the node and the control plane, both ways, on the node's address."""
    return Rule(
        PARTITION.table,
        PARTITION.name,
        (
            "-d",
            f"{address}/32",
            "-p",
            "tcp",
            "-m",
            "multiport",
            "--dports",
            f"{apiserver_port},{kubelet_port}",
            "-j",
            "DROP",
        ),
    )
