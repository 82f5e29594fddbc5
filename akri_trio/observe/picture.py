"""The picture of what Akri is doing, as a pure function of the cluster's objects.

An operator asks "which Pod holds slot 1 of camera X, and why did camera Y not appear?". The
answer is spread over Configurations (each node's conditions in `status.nodes`), Instances
(`nodes`, `deviceUsage`), Pods (which node, which `akri.sh/...` resources, broker labels) and
Jobs. `picture` joins them into one plain JSON-able dict; `akri-trio status` renders it as text
(`render_text`), `status -o json` prints it, and the dashboard sends it to the page. No I/O here.

Which Pod holds a slot: `deviceUsage` says which node (and, for the Configuration-level
resource, which virtual device) holds it; the Pods on that node that request the slot's resource
(`akri.sh/<instance>` or `akri.sh/<configuration>`) and have not finished are its holders. When
several Pods on one node use one Instance, each of its slots held there lists all of them: only
that node's kubelet knows the exact pairing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from akri_trio.model.naming import ConfigClaim, DraClaim, Free, NodeClaim, parse_usage

__all__ = ["LABEL_CONFIGURATION", "LABEL_INSTANCE", "akri_requests", "picture", "render_text"]

JSON = dict[str, Any]
LABEL_INSTANCE = "akri.sh/instance"
LABEL_CONFIGURATION = "akri.sh/configuration"
LABEL_TARGET_NODE = "akri.sh/target-node"
RESOURCE_PREFIX = "akri.sh/"
_FINISHED = ("Succeeded", "Failed")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _ref(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def akri_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The `akri.sh/...` resources a Pod's containers ask for (limits, else requests), by the
    name after the prefix (an Instance's or a Configuration's), summed over containers."""
    wanted: dict[str, int] = {}
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        asked = resources.get("limits") or resources.get("requests") or {}
        for resource, quantity in asked.items():
            if resource.startswith(RESOURCE_PREFIX):
                name = resource[len(RESOURCE_PREFIX) :]
                try:
                    wanted[name] = wanted.get(name, 0) + int(quantity)
                except (TypeError, ValueError):
                    wanted[name] = wanted.get(name, 0) + 1
    return wanted


def _phase(pod: Mapping[str, Any]) -> str:
    if _meta(pod).get("deletionTimestamp"):
        return "Terminating"
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _holders(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """(node, resource name) -> the live Pods on that node asking for it, sorted."""
    out: dict[tuple[str, str], list[str]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or _phase(pod) in _FINISHED:
            continue
        for name in akri_requests(pod):
            out.setdefault((node, name), []).append(_ref(pod))
    return {k: sorted(v) for k, v in out.items()}


def _broker(obj: Mapping[str, Any], kind: str) -> JSON:
    labels = _meta(obj).get("labels") or {}
    node = (obj.get("spec") or {}).get("nodeName") or labels.get(LABEL_TARGET_NODE, "")
    if kind == "Job":
        status = obj.get("status") or {}
        phase = (
            "Complete"
            if status.get("succeeded")
            else "Failed"
            if status.get("failed")
            else ("Running" if status.get("active") else "Pending")
        )
    else:
        phase = _phase(obj)
    return {"kind": kind, "name": _ref(obj), "node": node, "phase": phase}


def _slots(inst: Mapping[str, Any], holders: Mapping[tuple[str, str], list[str]]) -> list[JSON]:
    name = str(_meta(inst).get("name", ""))
    spec = inst.get("spec") or {}
    usage: Mapping[str, str] = spec.get("deviceUsage") or {}
    config = str(spec.get("configurationName", ""))
    capacity = int(spec.get("capacity") or 0)
    ids = [f"{name}-{i}" for i in range(capacity)]
    ids += sorted(k for k in usage if k not in ids and usage[k])  # held beyond capacity
    slots = []
    for slot in ids:
        match parse_usage(usage.get(slot, "")):
            case Free():
                slots.append({"slot": slot, "node": "", "vdev": "", "pods": []})
            case NodeClaim(node):
                pods = holders.get((node, name), [])
                slots.append({"slot": slot, "node": node, "vdev": "", "pods": pods})
            case ConfigClaim(vdev, node):
                pods = holders.get((node, config), [])
                slots.append({"slot": slot, "node": node, "vdev": vdev, "pods": pods})
            case DraClaim(_, node):  # a DRA claim, prepared before a switch back
                slots.append({"slot": slot, "node": node, "vdev": "", "pods": []})
    return slots


def picture(
    configurations: Iterable[Mapping[str, Any]],
    instances: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    jobs: Iterable[Mapping[str, Any]] = (),
    nodes: Iterable[Mapping[str, Any]] = (),
) -> JSON:
    """Every Configuration (with each node's handlers and conditions, its Instances, and its
    Configuration-level brokers) and every Instance (slots with holders, brokers), sorted by
    namespace and name. Instances whose Configuration is not there are listed all the same."""
    pods = list(pods)
    holders = _holders(pods)
    brokers: dict[str, list[JSON]] = {}
    config_brokers: dict[str, list[JSON]] = {}
    for kind, objs in (("Pod", pods), ("Job", list(jobs))):
        for obj in objs:
            labels = _meta(obj).get("labels") or {}
            ns = _meta(obj).get("namespace", "")
            if labels.get(LABEL_INSTANCE):
                brokers.setdefault(f"{ns}/{labels[LABEL_INSTANCE]}", []).append(_broker(obj, kind))
            elif labels.get(LABEL_CONFIGURATION):
                key = f"{ns}/{labels[LABEL_CONFIGURATION]}"
                config_brokers.setdefault(key, []).append(_broker(obj, kind))
    out_instances: list[JSON] = []
    by_config: dict[str, list[str]] = {}
    for inst in sorted(instances, key=_ref):
        meta, spec = _meta(inst), inst.get("spec") or {}
        slots = _slots(inst, holders)
        config_ref = f"{meta.get('namespace', '')}/{spec.get('configurationName', '')}"
        by_config.setdefault(config_ref, []).append(str(meta.get("name", "")))
        out_instances.append(
            {
                "namespace": meta.get("namespace", ""),
                "name": meta.get("name", ""),
                "configuration": spec.get("configurationName", ""),
                "shared": bool(spec.get("shared")),
                "nodes": list(spec.get("nodes") or []),
                "capacity": int(spec.get("capacity") or 0),
                "used": sum(1 for s in slots if s["node"]),
                "slots": slots,
                "brokers": sorted(brokers.get(_ref(inst), []), key=lambda b: b["name"]),
                "deleting": bool(meta.get("deletionTimestamp")),
            }
        )
    out_configs: list[JSON] = []
    for cfg in sorted(configurations, key=_ref):
        meta, spec = _meta(cfg), cfg.get("spec") or {}
        handler = spec.get("discoveryHandler") or {}
        entries = sorted(
            ((cfg.get("status") or {}).get("nodes") or []), key=lambda e: str(e.get("node"))
        )
        out_configs.append(
            {
                "namespace": meta.get("namespace", ""),
                "name": meta.get("name", ""),
                "handler": handler.get("name", ""),
                "capacity": int(spec.get("capacity") or 1),
                "nodes": [
                    {
                        "node": e.get("node", ""),
                        "instances": e.get("instances", 0),
                        "handlers": list(e.get("handlers") or []),
                        "problems": list(e.get("problems") or []),
                        "conditions": [
                            {k: c.get(k, "") for k in ("type", "status", "reason", "message")}
                            for c in e.get("conditions") or []
                        ],
                    }
                    for e in entries
                ],
                "instances": by_config.get(_ref(cfg), []),
                "brokers": sorted(config_brokers.get(_ref(cfg), []), key=lambda b: b["name"]),
            }
        )
    out_nodes = [
        {"name": _meta(n).get("name", ""), "ready": _ready(n)}
        for n in sorted(nodes, key=lambda n: str(_meta(n).get("name", "")))
    ]
    return {"configurations": out_configs, "instances": out_instances, "nodes": out_nodes}


def _ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


# --- text ---------------------------------------------------------------------------------------


def _handlers_text(entry: Mapping[str, Any]) -> str:
    states = [str(h.get("state", "?")) for h in entry.get("handlers") or []]
    if not states:
        return "no handler"
    counts = {s: states.count(s) for s in dict.fromkeys(states)}
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def _slot_text(slot: Mapping[str, Any]) -> str:
    if not slot["node"]:
        return "free"
    via = f" (as {slot['vdev']})" if slot["vdev"] else ""
    pods = ", ".join(slot["pods"]) if slot["pods"] else "no running Pod seen"
    return f"{slot['node']}{via}  {pods}"


def _instance_lines(inst: Mapping[str, Any], indent: str) -> list[str]:
    shared = "shared" if inst["shared"] else "local"
    gone = "  (deleting)" if inst["deleting"] else ""
    lines = [
        f"{indent}Instance {inst['name']}  {shared}  nodes: {', '.join(inst['nodes']) or '-'}"
        f"  slots {inst['used']}/{inst['capacity']} used{gone}"
    ]
    for slot in inst["slots"]:
        lines.append(f"{indent}  {slot['slot']:<40} {_slot_text(slot)}")
    lines.extend(_broker_line(broker, indent + "  ") for broker in inst["brokers"])
    return lines


def _broker_line(broker: Mapping[str, Any], indent: str) -> str:
    return f"{indent}broker {broker['kind']} {broker['name']}  on {broker['node'] or '-'}  " + str(
        broker["phase"]
    )


def render_text(pic: Mapping[str, Any]) -> str:
    """The picture as indented text: Configuration -> nodes (handlers, failing conditions) ->
    Instances (slots and their holders) -> brokers. Ends with a newline."""
    lines: list[str] = []
    instances = {(i["namespace"], i["name"]): i for i in pic["instances"]}
    listed: set[tuple[str, str]] = set()
    if not pic["configurations"] and not pic["instances"]:
        return "No Configurations or Instances.\n"
    for cfg in pic["configurations"]:
        lines.append(
            f"Configuration {cfg['namespace']}/{cfg['name']}  handler {cfg['handler']}"
            f"  capacity {cfg['capacity']}  instances {len(cfg['instances'])}"
        )
        if not cfg["nodes"]:
            lines.append("  no agent has reported on it yet")
        for entry in cfg["nodes"]:
            failing = [c for c in entry["conditions"] if c["status"] != "True"]
            state = "ok" if not failing else ", ".join(f"{c['type']}=False" for c in failing)
            lines.append(
                f"  node {entry['node']}: handlers {_handlers_text(entry)}; "
                f"{entry['instances']} instance(s); {state}"
            )
            for cond in failing:
                lines.append(f"    {cond['type']} ({cond['reason']}): {cond['message']}")
            for problem in entry["problems"]:
                lines.append(f"    problem: {problem}")
        for name in cfg["instances"]:
            key = (cfg["namespace"], name)
            listed.add(key)
            lines.extend(_instance_lines(instances[key], "  "))
        lines.extend(_broker_line(broker, "  ") for broker in cfg["brokers"])
    orphans = [i for k, i in instances.items() if k not in listed]
    if orphans:
        lines.append("Instances without their Configuration:")
        for inst in orphans:
            lines.extend(_instance_lines(inst, "  "))
    return "\n".join(lines) + "\n"
