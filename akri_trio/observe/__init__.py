"""Observability for the agent and controller: metrics that are really exported, and probes.

Upstream declares its agent metrics but never updates them (research/akri-upstream.md §5); here
`metrics` holds the registry every component records into and `http` serves it, with the
/healthz and /readyz endpoints kubelet probes, from one small trio server per process.
"""
