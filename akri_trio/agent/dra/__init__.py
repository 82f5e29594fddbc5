"""DRA mode on the node: the node's pools as ResourceSlices and the kubelet plugin that
prepares claims through CDI. The same shape as the controller's side (`akri_trio/controller/dra/`):
`plan.py` the pure decisions (which pools, which devices may be prepared), `pool_reconciler.py`
the pools' reconciler on the shared runner, writing through `akri_trio.dra.edge.PoolWriter` as
the controller's shared pools do; `node.py` starts it all, `preparer.py` and `plugin.py` serve
the kubelet."""
