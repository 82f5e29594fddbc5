"""Upper bounds on what a Configuration or a discovery handler can make a node do.

A Configuration is written by a tenant and a handler's device list comes from the network, so
each number here bounds the work, memory and kubelet traffic one of them can cause. The CRD
schema, the webhook and the agent read the same constants; the agent's device caps are
defaults of its flags.
"""

from __future__ import annotations

from typing import Final

# Slots per Instance. Each is a kubelet device and a possible deviceUsage entry on a shared
# object, and no device is shared by more workloads than this. The CRD's `maximum`.
MAX_CAPACITY: Final = 1024
# Devices the agent takes from one handler endpoint's list, and for one Configuration after
# merging every endpoint's: each is an Instance, a device plugin and a socket on the node.
MAX_DEVICES_PER_HANDLER: Final = 2048
MAX_DEVICES_PER_CONFIGURATION: Final = 2048
# What one device may carry: its properties become environment variables of every broker
# container and are copied into its Instance (etcd keeps an object under 1.5 MiB), and the
# agent holds up to MAX_DEVICES_PER_HANDLER of them per endpoint. Bytes count the UTF-8 of the
# id, every property name and value, and every mount and device-node path.
MAX_PROPERTIES_PER_DEVICE: Final = 256
MAX_DEVICE_BYTES: Final = 64 * 1024
# The kubelet's gRPC client refuses a message over 4 MiB (grpc-go's default receive limit):
# a ListAndWatch answer is kept below it, with room for the framing.
KUBELET_MESSAGE_LIMIT: Final = 4 * 1024 * 1024 - 4096
