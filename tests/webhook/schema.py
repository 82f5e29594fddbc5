"""A small OpenAPI v2 document shaped like the API server's, for the webhook's tests."""

from __future__ import annotations

from typing import Any

CORE = "io.k8s.api.core.v1"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/definitions/{name}"}


def string_map() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": {"type": "string"}}


def quantity_map() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": ref(QUANTITY)}


def containers() -> dict[str, Any]:
    return {"type": "array", "items": ref(f"{CORE}.Container")}


DEFINITIONS: dict[str, Any] = {
    f"{CORE}.PodSpec": {
        "type": "object",
        "required": ["containers"],
        "properties": {
            "containers": containers(),
            "initContainers": containers(),
            "nodeSelector": string_map(),
            "affinity": ref(f"{CORE}.Affinity"),  # not defined here: accepted unchecked
            "overhead": quantity_map(),
            "activeDeadlineSeconds": {"type": "integer", "format": "int64"},
            "hostNetwork": {"type": "boolean"},
            "raw": ref("io.k8s.apimachinery.pkg.runtime.RawExtension"),
            "preserved": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"known": {"type": "string"}},
            },
            "weights": {"type": "array", "items": {"type": "number"}},
        },
    },
    f"{CORE}.Container": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string"},
            "image": {"type": "string"},
            "resources": ref(f"{CORE}.ResourceRequirements"),
            "ports": {"type": "array", "items": ref(f"{CORE}.ContainerPort")},
            "livenessProbe": ref(f"{CORE}.Probe"),
        },
    },
    f"{CORE}.ResourceRequirements": {
        "type": "object",
        "properties": {"limits": quantity_map(), "requests": quantity_map()},
    },
    f"{CORE}.ContainerPort": {
        "type": "object",
        "required": ["containerPort"],
        "properties": {
            "containerPort": {"type": "integer", "format": "int32"},
            "protocol": {"type": "string"},
        },
    },
    f"{CORE}.Probe": {"type": "object", "properties": {"httpGet": ref(f"{CORE}.HTTPGetAction")}},
    f"{CORE}.HTTPGetAction": {
        "type": "object",
        "required": ["port"],
        "properties": {"port": ref(INT_OR_STRING), "path": {"type": "string"}},
    },
    INT_OR_STRING: {"type": "string", "format": "int-or-string"},
    QUANTITY: {"type": "string"},
    "io.k8s.apimachinery.pkg.runtime.RawExtension": {"type": "object"},
    "io.k8s.api.batch.v1.JobSpec": {
        "type": "object",
        "required": ["template"],
        "properties": {
            "template": ref(f"{CORE}.PodTemplateSpec"),
            "parallelism": {"type": "integer", "format": "int32"},
        },
    },
    f"{CORE}.PodTemplateSpec": {
        "type": "object",
        "properties": {
            "metadata": ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
            "spec": ref(f"{CORE}.PodSpec"),
        },
    },
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
        "type": "object",
        "properties": {"labels": string_map(), "annotations": string_map()},
    },
    f"{CORE}.ServiceSpec": {
        "type": "object",
        "properties": {
            "ports": {"type": "array", "items": ref(f"{CORE}.ServicePort")},
            "selector": string_map(),
            "type": {"type": "string"},
        },
    },
    f"{CORE}.ServicePort": {
        "type": "object",
        "required": ["port"],
        "properties": {
            "port": {"type": "integer", "format": "int32"},
            "targetPort": ref(INT_OR_STRING),
            "name": {"type": "string"},
        },
    },
}

DOCUMENT: dict[str, Any] = {"swagger": "2.0", "definitions": DEFINITIONS}
