"""Observability for the agent and controller: metrics, probes, and the views of the cluster.

`metrics` holds upstream Akri's metric families (so upstream's dashboards work) and the
registry helpers every component records into; `endpoints` serves it, with the /healthz and
/readyz endpoints kubelet probes, on the runtime's small HTTP server (akri_trio.runtime.http).
"""
