"""The controller's side of DRA mode, in the agent's shape (`akri_trio/agent/dra/`): `plan.py`
the pure decisions (DeviceClasses, shared pools, broker claims, the keys the reconciles run
under), `reconcilers.py` the edges that read the caches, ask the plan and write (a shared pool
through `akri_trio.dra.edge.PoolWriter`, as the agent's node pools)."""
