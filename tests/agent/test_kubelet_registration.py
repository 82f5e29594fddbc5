"""Registering with the kubelet: what counts as registered."""

from __future__ import annotations

from akri_trio.agent.plugins.kubelet import already_connected


def test_a_second_register_of_a_connected_socket_counts_as_registered() -> None:
    refusal = (
        "RPC failed with status UNKNOWN (2): device plugin already connected: "
        "/var/lib/kubelet/device-plugins/akri-foo-1795451286.sock"
    )
    assert already_connected(refusal, "akri-foo-1795451286.sock")
    assert not already_connected(refusal, "akri-bar-1795451286.sock")
    assert not already_connected("RPC failed: resource name is invalid", "akri-foo.sock")
