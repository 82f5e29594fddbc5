"""The chart's values.schema.json, made from its values.yaml: every map of ours refuses keys it
does not have (`additionalProperties: false`, so Helm names a misspelt key and where it is),
leaves keep the type of their default (or null, as upstream's values leave many empty), and the
maps that are the user's own (node selectors, env, securityContexts, ...) are free.

`python -m tests.support.chart_schema` rewrites the file; tests/deploy/test_values.py checks
that the committed one is what this makes, so the two cannot drift apart."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "k8s" / "helm" / "akri-trio"
SCHEMA = CHART / "values.schema.json"

# Maps whose keys are the user's (a path pattern: `*` is any one key).
FREE = {
    "*.nodeSelectors",
    "*.*.nodeSelectors",
    "*.securityContext",
    "*.*.*.securityContext",
    "*.namespaceSelector",
    "webhookConfiguration.certManager.issuerRef",
    "*.*.brokerProperties",
    "*.*.*.env",
    "zeroconf.configuration.discoveryDetails",
}
# Keys upstream's values have that the defaults here leave out: accepted (templates refuse the
# retired ones with a message naming what to use instead).
EXTRA: dict[str, dict[str, Any]] = {
    "": {
        "useDevelopmentContainers": {"type": ["boolean", "null"]},
        "kubernetesDistro": {},
    },
    "agent.host": {"containerRuntimeSocket": {}},
    "webhookConfiguration": {
        "ttlSecondsAfterFinished": {"type": ["integer", "null"]},
        "certImage": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "reference": {"type": ["string", "null"]},
                "tag": {"type": ["string", "null"]},
                "pullPolicy": {"type": ["string", "null"]},
            },
        },
    },
    "opcua.configuration.discoveryDetails": {"opcuaDiscoveryMethod": {}},
    # upstream names a Service's port by `portName` for some handlers, `name` for others
    "*.configuration.instanceService": {
        "name": {"type": ["string", "null"]},
        "portName": {"type": ["string", "null"]},
    },
    "*.configuration.configurationService": {
        "name": {"type": ["string", "null"]},
        "portName": {"type": ["string", "null"]},
    },
}
# Leaves whose type is wider than their default's.
LOOSE: dict[str, dict[str, Any]] = {
    "*.tolerations": {"type": ["array", "object", "null"]},
    "*.*.tolerations": {"type": ["array", "object", "null"]},
    "webhookConfiguration.caBundle": {"type": ["string", "null"]},
    "custom.configuration.discoveryDetails": {"type": ["string", "null"]},
    "*.*.discoveryDetails.udevRules": {"type": ["array", "null"], "items": {"type": "string"}},
    "*.*.*.envFrom": {
        "type": ["object", "null"],
        "additionalProperties": False,
        "properties": {
            "secretRef": {"type": ["array", "null"], "items": {"type": "string"}},
            "configMapRef": {"type": ["array", "null"], "items": {"type": "string"}},
        },
    },
    "crds.group": {"enum": ["akri.sh"]},
    "crds.version": {"enum": ["v0"]},
}


def _matches(pattern: str, path: str) -> bool:
    want, have = pattern.split("."), path.split(".")
    return len(want) == len(have) and all(w in ("*", h) for w, h in zip(want, have, strict=True))


def _lookup(table: dict[str, dict[str, Any]], path: str) -> dict[str, Any] | None:
    for pattern, schema in table.items():
        if _matches(pattern, path):
            return schema
    return None


def _leaf(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"type": ["boolean", "null"]}
    if isinstance(value, int):
        return {"type": ["integer", "string", "null"]}
    if isinstance(value, str) and value == "":
        # empty: "use the default", and `--set` may give a number (a port, a group id)
        return {"type": ["string", "integer", "boolean", "null"]}
    if isinstance(value, str):
        return {"type": ["string", "number", "null"]}
    return {}


def schema_of(value: Any, path: str = "") -> dict[str, Any]:
    loose = _lookup(LOOSE, path)
    if loose is not None:
        return loose
    if any(_matches(p, path) for p in FREE):
        return {"type": ["object", "null"]}
    if isinstance(value, dict):
        properties = {
            key: schema_of(v, f"{path}.{key}" if path else key) for key, v in value.items()
        }
        for pattern, extra in EXTRA.items():
            if _matches(pattern, path) if pattern else not path:
                properties.update({k: v for k, v in extra.items() if k not in properties})
        return {
            "type": ["object", "null"] if path else "object",
            "additionalProperties": False,
            "properties": properties,
        }
    if isinstance(value, list):
        return {"type": ["array", "null"]}
    if value is None:
        return {}
    return _leaf(value)


def chart_schema() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return {"$schema": "https://json-schema.org/draft-07/schema#", **schema_of(values)}


def render_schema() -> str:
    return json.dumps(chart_schema(), indent=2) + "\n"


if __name__ == "__main__":
    SCHEMA.write_text(render_schema())
    sys.exit(0)
