"""DRA mode on the node: the node's pools as ResourceSlices and the kubelet plugin that
prepares claims through CDI (the decisions come from `akri_trio.dra` and `pools`)."""
