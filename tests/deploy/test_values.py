"""Upstream Akri's values carry over: each key of upstream's `deployment/helm/values.yaml`, set
to a sentinel of its own, lands where upstream's chart puts it; the values of upstream's
documentation walkthroughs (ONVIF with credentials, OPC UA discovery URLs, udev video) make the
Configurations they make there, field by field; and a key the chart does not know is refused,
naming it (values.schema.json, tests/support/chart_schema.py)."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
import yaml

from tests.support.chart import by_kind, env_of, one, pod_spec, render, workloads
from tests.support.chart_schema import SCHEMA, render_schema

HANDLERS = ("custom", "debugEcho", "onvif", "opcua", "udev")
SHORT = {"debugEcho": "debug-echo"}


def test_the_schema_is_made_from_the_values() -> None:
    assert SCHEMA.read_text() == render_schema()


def _resources(prefix: str) -> dict[str, str]:
    return {
        "memoryRequest": f"{prefix}1Mi",
        "cpuRequest": f"{prefix}1m",
        "memoryLimit": f"{prefix}2Mi",
        "cpuLimit": f"{prefix}2m",
    }


def _expected_resources(prefix: str) -> dict[str, dict[str, str]]:
    return {
        "requests": {"memory": f"{prefix}1Mi", "cpu": f"{prefix}1m"},
        "limits": {"memory": f"{prefix}2Mi", "cpu": f"{prefix}2m"},
    }


TOLERATION = {"key": "edge", "operator": "Exists", "effect": "NoSchedule"}


def _component_values() -> dict[str, Any]:
    """Every upstream key of the agent, the controller, the webhook and the top level."""
    return {
        "useLatestContainers": True,
        "useDevelopmentContainers": True,  # no -dev images here: nothing to do
        "imagePullSecrets": [{"name": "s-pull"}],
        "cleanupHook": {"enabled": True},
        "crds": {"group": "akri.sh", "version": "v0"},
        "rbac": {"enabled": True},
        "prometheus": {
            "enabled": True,
            "endpoint": "/s-metrics",
            "port": 18001,
            "portName": "s-port",
        },
        "agent": {
            "enabled": True,
            "full": True,
            "image": {
                "repository": "s/agent",
                "fullRepository": "s/agent-full",
                "tag": "s-agent-tag",
                "pullPolicy": "Never",
            },
            "securityContext": {"runAsGroup": 4242},
            "host": {
                "discoveryHandlers": "/s/akri",
                "kubeletDevicePlugins": "/s/dp",
                "kubeletPodResources": "/s/pr",
                "udev": "/s/udev",
            },
            "allowDebugEcho": True,
            "nodeSelectors": {"s-agent": "yes"},
            "tolerations": [TOLERATION],
            "resources": _resources("11"),
        },
        "controller": {
            "enabled": True,
            "image": {"repository": "s/controller", "tag": "s-ctl-tag", "pullPolicy": "Always"},
            "securityContext": {"runAsUser": 1000},
            "onlyOnControlPlane": True,
            "allowOnControlPlane": True,
            "tolerations": [TOLERATION],
            "nodeSelectors": {"s-controller": "yes"},
            "resources": _resources("12"),
        },
        "webhookConfiguration": {
            "enabled": True,
            "name": "s-webhook",
            "caBundle": "czEK",
            "ttlSecondsAfterFinished": 7,  # no certificate Job here: nothing to do
            "image": {"repository": "s/webhook", "tag": "s-wh-tag", "pullPolicy": "Always"},
            "certImage": {"reference": "s/certgen", "tag": "v9", "pullPolicy": "Never"},
            "onlyOnControlPlane": True,
            "allowOnControlPlane": False,
            "nodeSelectors": {"s-webhook": "yes"},
            "tolerations": [TOLERATION],
            "resources": _resources("13"),
        },
    }


def test_upstream_component_keys_land_where_upstreams_do() -> None:
    objects = render(_component_values())
    ds = one(objects, "DaemonSet", "akri-agent-daemonset")
    agent = pod_spec(ds)
    (a,) = agent["containers"]
    assert a["image"] == "s/agent-full:s-agent-tag"  # full: fullRepository, the given tag
    assert a["imagePullPolicy"] == "Never"
    assert a["securityContext"]["runAsGroup"] == 4242
    assert a["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # merged, not replaced
    host = {v["name"]: v["hostPath"]["path"] for v in agent["volumes"] if "hostPath" in v}
    assert host["discovery-handlers"] == "/s/akri"
    assert host["device-plugins"] == "/s/dp"
    assert host["pod-resources"] == "/s/pr"
    assert host["udev"] == "/s/udev"
    assert agent["hostNetwork"] is True  # full
    assert env_of(a)["ENABLE_DEBUG_ECHO"] == "1"  # full with allowDebugEcho
    assert agent["nodeSelector"] == {"kubernetes.io/os": "linux", "s-agent": "yes"}
    assert agent["tolerations"] == [TOLERATION]
    assert a["resources"] == _expected_resources("11")
    assert agent["imagePullSecrets"] == [{"name": "s-pull"}]
    assert a["ports"][0] == {"name": "s-port", "containerPort": 18001}
    assert env_of(a)["METRICS_PORT"] == "18001"

    deploy = one(objects, "Deployment", "akri-controller-deployment")
    ctl = pod_spec(deploy)
    (c,) = ctl["containers"]
    assert (c["image"], c["imagePullPolicy"]) == ("s/controller:s-ctl-tag", "Always")
    assert c["securityContext"]["runAsUser"] == 1000
    assert ctl["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "node-role.kubernetes.io/control-plane": "",
        "s-controller": "yes",
    }
    assert ctl["tolerations"] == [
        {
            "key": "node-role.kubernetes.io/control-plane",
            "operator": "Exists",
            "effect": "NoSchedule",
        },
        TOLERATION,
    ]
    assert c["resources"] == _expected_resources("12")

    hook = one(objects, "Deployment", "s-webhook")
    wh = pod_spec(hook)
    (w,) = wh["containers"]
    assert (w["image"], w["imagePullPolicy"]) == ("s/webhook:s-wh-tag", "Always")
    assert wh["nodeSelector"]["node-role.kubernetes.io/control-plane"] == ""
    assert wh["tolerations"] == [TOLERATION]  # allowOnControlPlane false: only the user's
    assert w["resources"] == _expected_resources("13")
    (registration,) = one(objects, "ValidatingWebhookConfiguration", "s-webhook")["webhooks"]
    assert registration["clientConfig"]["caBundle"] == "czEK"

    monitors = by_kind(objects, "PodMonitor")
    assert monitors["akri-agent-metrics"]["spec"]["podMetricsEndpoints"] == [
        {"port": "s-port", "path": "/s-metrics"}
    ]
    assert "akri-teardown" in by_kind(objects, "Job")  # cleanupHook.enabled
    assert "akri-agent-role" in by_kind(objects, "ClusterRole")  # rbac.enabled

    # useLatestContainers: `latest` where no tag is given
    (plain,) = pod_spec(
        one(render({"useLatestContainers": True}), "DaemonSet", "akri-agent-daemonset")
    )["containers"]
    assert plain["image"] == "akri-trio:latest"
    # enabled: false removes each
    off = render(
        {
            "agent": {"enabled": False},
            "controller": {"enabled": False},
            "webhookConfiguration": {"enabled": False},
            "cleanupHook": {"enabled": False},
            "rbac": {"enabled": False},
        }
    )
    assert list(workloads(off)) == []
    assert not by_kind(off, "ClusterRole")


def _handler_values(key: str, *, job: bool) -> dict[str, Any]:
    """Every upstream key of one handler's `configuration` and `discovery`, with sentinels."""
    broker: dict[str, Any] = {
        "image": {"repository": f"s/{key}-broker", "tag": f"{key}-tag", "pullPolicy": "Never"},
        "env": {"S_ENV": f"{key}-env", "S_NUM": 5},
        "envFrom": {"secretRef": [f"{key}-secret"], "configMapRef": [f"{key}-cm"]},
        "volumes": [{"name": "s-vol", "emptyDir": {}}],
        "volumeMounts": [{"name": "s-vol", "mountPath": "/s"}],
        "resources": _resources("21"),
    }
    configuration: dict[str, Any] = {
        "enabled": True,
        "name": f"s-{key.lower()}",
        "brokerProperties": {"S_PROP": f"{key}-prop"},
        "capacity": 7,
        "createInstanceServices": True,
        "instanceService": {
            "name": "s-isvc",
            "portName": "s-iport",
            "type": "NodePort",
            "port": 8001,
            "targetPort": 9001,
            "protocol": "UDP",
        },
        "createConfigurationService": True,
        "configurationService": {
            "name": "s-csvc",
            "portName": "s-cport",
            "type": "ClusterIP",
            "port": 8002,
            "targetPort": 9002,
            "protocol": "TCP",
        },
    }
    if job:
        configuration["brokerJob"] = {
            **broker,
            "command": ["s-cmd"],
            "restartPolicy": "Never",
            "backoffLimit": 4,
            "parallelism": 3,
            "completions": 6,
        }
    else:
        configuration["brokerPod"] = broker
    discovery: dict[str, Any] = {
        "enabled": True,
        "image": {"repository": f"s/{key}-dh", "tag": f"{key}-dh-tag", "pullPolicy": "Never"},
        "useNetworkConnection": True,
        "port": 10007,
        "nodeSelectors": {f"s-{key.lower()}": "yes"},
        "resources": _resources("22"),
    }
    if key == "custom":
        configuration["discoveryHandlerName"] = "s-handler"
        configuration["discoveryDetails"] = "s: details"
        discovery["name"] = "s-custom-discovery"
    if key == "debugEcho":
        configuration["shared"] = False
        configuration["discoveryDetails"] = {"descriptions": ["s0", "s1"]}
    if key == "udev":
        configuration["discoveryDetails"] = {
            "groupRecursive": True,
            "udevRules": ['KERNEL=="s*"'],
            "permissions": "rw",
        }
        discovery["host"] = {"udev": "/s/run-udev"}
    if key == "onvif":
        configuration["discoveryDetails"] = {
            "ipAddresses": {"action": "Include", "items": ["10.0.0.9"]},
            "macAddresses": {"action": "Exclude", "items": ["aa:bb:cc:dd:ee:ff"]},
            "scopes": {"action": "Include", "items": ["onvif://s"]},
            "uuids": {"action": "Include", "items": ["s-uuid"]},
            "discoveryTimeoutSeconds": 9,
        }
        configuration["discoveryProperties"] = [{"name": "username_default", "value": "s-user"}]
    if key == "opcua":
        configuration["discoveryDetails"] = {
            "discoveryUrls": ["opc.tcp://s:4840/"],
            "applicationNames": {"action": "Include", "items": ["s-app"]},
        }
        configuration["mountCertificates"] = True
    return {key: {"configuration": configuration, "discovery": discovery}}


DETAILS = {
    "custom": "s: details",
    "debugEcho": {"descriptions": ["s0", "s1"]},
    "udev": {"groupRecursive": True, "udevRules": ['KERNEL=="s*"'], "permissions": "rw"},
    "onvif": {
        "ipAddresses": {"action": "Include", "items": ["10.0.0.9"]},
        "macAddresses": {"action": "Exclude", "items": ["aa:bb:cc:dd:ee:ff"]},
        "scopes": {"action": "Include", "items": ["onvif://s"]},
        "uuids": {"action": "Include", "items": ["s-uuid"]},
        "discoveryTimeoutSeconds": 9,
    },
    "opcua": {
        "opcuaDiscoveryMethod": {"standard": {"discoveryUrls": ["opc.tcp://s:4840/"]}},
        "applicationNames": {"action": "Include", "items": ["s-app"]},
    },
}


def _check_broker_container(key: str, c: dict[str, Any]) -> None:
    assert (c["image"], c["imagePullPolicy"]) == (f"s/{key}-broker:{key}-tag", "Never")
    assert env_of(c) == {"S_ENV": f"{key}-env", "S_NUM": "5"}
    assert c["envFrom"] == [
        {"secretRef": {"name": f"{key}-secret"}},
        {"configMapRef": {"name": f"{key}-cm"}},
    ]
    assert {"name": "s-vol", "mountPath": "/s"} in c["volumeMounts"]
    placeholder = {"{{PLACEHOLDER}}": "1"}
    expected = _expected_resources("21")
    assert c["resources"] == {
        "requests": {**placeholder, **expected["requests"]},
        "limits": {**placeholder, **expected["limits"]},
    }


@pytest.mark.parametrize("key", HANDLERS)
def test_upstream_handler_keys_land_where_upstreams_do(key: str) -> None:
    objects = render({**_handler_values(key, job=False), "imagePullSecrets": [{"name": "s-pull"}]})
    spec = one(objects, "Configuration", f"s-{key.lower()}")["spec"]
    handler = spec["discoveryHandler"]
    assert handler["name"] == {"custom": "s-handler"}.get(key, key)
    details = handler["discoveryDetails"]
    assert (details if key == "custom" else yaml.safe_load(details)) == DETAILS[key]
    if key == "onvif":
        assert handler["discoveryProperties"] == [{"name": "username_default", "value": "s-user"}]
    assert spec["capacity"] == 7
    assert spec["brokerProperties"] == {"S_PROP": f"{key}-prop"}
    pod = spec["brokerSpec"]["brokerPodSpec"]
    (c,) = pod["containers"]
    _check_broker_container(key, c)
    assert {"name": "s-vol", "emptyDir": {}} in pod["volumes"]
    assert pod["imagePullSecrets"] == [{"name": "s-pull"}]
    if key == "opcua":  # mountCertificates
        assert pod["volumes"][0]["secret"]["secretName"] == "opcua-broker-credentials"
        assert c["volumeMounts"][0]["mountPath"] == "/etc/opcua-certs/client-pki"
    assert spec["instanceServiceSpec"] == {
        "type": "NodePort",
        "ports": [{"name": "s-iport", "port": 8001, "protocol": "UDP", "targetPort": 9001}],
    }
    assert spec["configurationServiceSpec"] == {
        "type": "ClusterIP",
        "ports": [{"name": "s-cport", "port": 8002, "protocol": "TCP", "targetPort": 9002}],
    }

    name = "s-custom-discovery" if key == "custom" else f"akri-{SHORT.get(key, key)}-discovery"
    ds = pod_spec(one(objects, "DaemonSet", f"{name}-daemonset"))
    (d,) = ds["containers"]
    assert (d["image"], d["imagePullPolicy"]) == (f"s/{key}-dh:{key}-dh-tag", "Never")
    assert d["resources"] == _expected_resources("22")
    assert ds["nodeSelector"] == {"kubernetes.io/os": "linux", f"s-{key.lower()}": "yes"}
    env = env_of(d)
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}  # useNetworkConnection
    if key != "custom":  # the user's own image gets no arguments
        assert d["args"][-1] == "--network=$(POD_IP):10007"
        assert d["ports"] == [{"name": "discovery", "containerPort": 10007}]
    if key == "debugEcho":
        assert env["DEBUG_ECHO_INSTANCES_SHARED"] == "false"  # configuration.shared
    if key == "udev":
        udev = next(v for v in ds["volumes"] if v["name"] == "udev")
        assert udev["hostPath"]["path"] == "/s/run-udev"


@pytest.mark.parametrize("key", HANDLERS)
def test_upstream_broker_job_keys_land_where_upstreams_do(key: str) -> None:
    objects = render({**_handler_values(key, job=True), "imagePullSecrets": [{"name": "s-pull"}]})
    spec = one(objects, "Configuration", f"s-{key.lower()}")["spec"]
    job = spec["brokerSpec"]["brokerJobSpec"]
    assert (job["backoffLimit"], job["parallelism"], job["completions"]) == (4, 3, 6)
    template = job["template"]["spec"]
    assert template["restartPolicy"] == "Never"
    assert template["imagePullSecrets"] == [{"name": "s-pull"}]
    assert template["volumes"] == [{"name": "s-vol", "emptyDir": {}}]
    (c,) = template["containers"]
    assert c["command"] == ["s-cmd"]
    _check_broker_container(key, c)
    assert "instanceServiceSpec" not in spec  # Services front broker Pods only, as upstream


# --- upstream's documentation walkthroughs ------------------------------------------------------


def _walkthrough(key: str, **configuration: Any) -> dict[str, Any]:
    """A handler's DaemonSet and its sample Configuration, as the walkthroughs install them."""
    return {
        key: {
            "discovery": {"enabled": True},
            "configuration": {"enabled": True, **configuration},
        }
    }


CREDENTIALS = [
    {
        "name": "username_default",
        "valueFrom": {"secretKeyRef": {"name": "onvif-auth-secret", "key": "username"}},
    },
    {
        "name": "password_default",
        "valueFrom": {
            "secretKeyRef": {
                "name": "onvif-auth-secret",
                "namespace": "default",
                "key": "password",
                "optional": True,
            }
        },
    },
]


def test_onvif_walkthrough_with_credentials() -> None:
    """ONVIF cameras that need a login: a default username and password from a Secret."""
    values = _walkthrough(
        "onvif",
        brokerPod={"image": {"repository": "ghcr.io/project-akri/akri/onvif-video-broker"}},
        discoveryProperties=CREDENTIALS,
    )
    config = one(render(values), "Configuration", "akri-onvif")
    spec = config["spec"]
    assert spec["discoveryHandler"]["name"] == "onvif"
    assert yaml.safe_load(spec["discoveryHandler"]["discoveryDetails"]) == {
        "ipAddresses": {"action": "Exclude", "items": []},
        "macAddresses": {"action": "Exclude", "items": []},
        "scopes": {"action": "Exclude", "items": []},
        "uuids": {"action": "Exclude", "items": []},
        "discoveryTimeoutSeconds": 1,
    }
    # each reference as written: the agent reads the Configuration's own namespace for the one
    # that names none
    assert spec["discoveryHandler"]["discoveryProperties"] == CREDENTIALS
    assert spec["capacity"] == 1
    (broker,) = spec["brokerSpec"]["brokerPodSpec"]["containers"]
    assert broker["name"] == "akri-onvif-broker"
    assert broker["image"] == "ghcr.io/project-akri/akri/onvif-video-broker:latest"
    assert broker["resources"]["limits"] == {
        "{{PLACEHOLDER}}": "1",
        "memory": "400Mi",
        "cpu": "2800m",
    }
    assert spec["instanceServiceSpec"]["ports"] == [
        {"name": "grpc", "port": 80, "protocol": "TCP", "targetPort": 8083}
    ]
    assert spec["configurationServiceSpec"]["ports"] == spec["instanceServiceSpec"]["ports"]


def test_opcua_walkthrough_discovery_urls() -> None:
    """akri-docs' OPC UA walkthrough, as `--set`s: `discoveryDetails.discoveryUrls[0]=...`."""
    sets = [
        "opcua.discovery.enabled=true",
        "opcua.configuration.enabled=true",
        "opcua.configuration.name=akri-opcua-monitoring",
        "opcua.configuration.brokerPod.image.repository=ghcr.io/project-akri/akri/opcua-monitoring-broker",
        "opcua.configuration.brokerProperties.IDENTIFIER=Thermometer_Temperature",
        "opcua.configuration.brokerProperties.NAMESPACE_INDEX=2",
        "opcua.configuration.discoveryDetails.discoveryUrls[0]=opc.tcp://10.0.0.5:4840/",
        "opcua.configuration.discoveryDetails.discoveryUrls[1]=opc.tcp://10.0.0.6:4840/",
    ]
    values = helm_python.parse_set_string(",".join(sets))  # as `helm install --set ...`
    config = one(render(values), "Configuration", "akri-opcua-monitoring")
    spec = config["spec"]
    assert spec["discoveryHandler"]["name"] == "opcua"
    assert yaml.safe_load(spec["discoveryHandler"]["discoveryDetails"]) == {
        "opcuaDiscoveryMethod": {
            "standard": {"discoveryUrls": ["opc.tcp://10.0.0.5:4840/", "opc.tcp://10.0.0.6:4840/"]}
        },
        "applicationNames": {"action": "Exclude", "items": []},
    }
    assert spec["brokerProperties"] == {
        "IDENTIFIER": "Thermometer_Temperature",
        "NAMESPACE_INDEX": "2",
    }
    (broker,) = spec["brokerSpec"]["brokerPodSpec"]["containers"]
    assert broker["image"] == "ghcr.io/project-akri/akri/opcua-monitoring-broker:latest"
    assert "volumes" not in spec["brokerSpec"]["brokerPodSpec"]  # mountCertificates off


def test_udev_video_walkthrough() -> None:
    """akri-docs' USB camera walkthrough: udev rules for video4linux, the video broker."""
    values = _walkthrough(
        "udev",
        name="akri-udev-video",
        discoveryDetails={"udevRules": ['KERNEL=="video[0-9]*"']},
        brokerPod={"image": {"repository": "ghcr.io/project-akri/akri/udev-video-broker"}},
    )
    spec = one(render(values), "Configuration", "akri-udev-video")["spec"]
    assert spec["discoveryHandler"]["name"] == "udev"
    assert yaml.safe_load(spec["discoveryHandler"]["discoveryDetails"]) == {
        "udevRules": ['KERNEL=="video[0-9]*"'],
        "groupRecursive": False,
        "permissions": "rwm",
    }
    assert spec["capacity"] == 1
    (broker,) = spec["brokerSpec"]["brokerPodSpec"]["containers"]
    assert broker["image"] == "ghcr.io/project-akri/akri/udev-video-broker:latest"
    assert broker["resources"]["requests"] == {
        "{{PLACEHOLDER}}": "1",
        "memory": "10Mi",
        "cpu": "10m",
    }
    assert spec["instanceServiceSpec"] == {
        "type": "ClusterIP",
        "ports": [{"name": "grpc", "port": 80, "protocol": "TCP", "targetPort": 8083}],
    }


# --- refused ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"agent": {"nodeSelector": {"a": "b"}}},
            "at '/agent': additional properties 'nodeSelector' not allowed",
        ),
        (
            {"opcua": {"configuration": {"discoveryDetails": {"discoveryUrl": ["opc.tcp://x/"]}}}},
            "at '/opcua/configuration/discoveryDetails': additional properties 'discoveryUrl' "
            "not allowed",
        ),
        ({"webhookConfiguration": {"enable": True}}, "additional properties 'enable' not allowed"),
        (
            {"udev": {"configuration": {"brokerPod": {"envFrom": {"secretRefs": ["x"]}}}}},
            "'secretRefs' not allowed",
        ),
        ({"crds": {"version": "v1"}}, "at '/crds/version'"),
    ],
)
def test_an_unknown_or_misspelt_key_is_refused_naming_it(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(
        helm_python.HelmError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        render(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kubernetesDistro": "k3s"}, "kubernetesDistro: remove it"),
        (
            {"agent": {"host": {"containerRuntimeSocket": "/run/containerd/containerd.sock"}}},
            "agent.host.containerRuntimeSocket: remove it; akri-trio reads the kubelet's",
        ),
        (
            {
                "opcua": {
                    "configuration": {
                        "enabled": True,
                        "discoveryDetails": {
                            "opcuaDiscoveryMethod": {
                                "standard": {"discoveryUrls": ["opc.tcp://x/"]}
                            }
                        },
                    }
                }
            },
            "use opcua.configuration.discoveryDetails.discoveryUrls",
        ),
    ],
)
def test_retired_keys_are_refused_with_what_to_use_instead(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmError, match=message):
        render(values)


def test_added_keys_log_and_extra_env_per_component() -> None:
    """Not upstream's: the log level and format of every component (each component's own over
    the top-level one) and extra env entries."""
    values = {
        "log": {"level": "debug", "format": "json"},
        "controller": {"log": {"level": "WARNING"}, "extraEnv": [{"name": "S_X", "value": "1"}]},
        "agent": {
            "extraEnv": [{"name": "S_Y", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
        },
        "udev": {
            "discovery": {"enabled": True, "tolerations": [TOLERATION], "log": {"format": "text"}}
        },
    }
    objects = render(values)
    containers = {o["metadata"]["name"]: pod_spec(o)["containers"][0] for o in workloads(objects)}
    agent = env_of(containers["akri-agent-daemonset"])
    assert (agent["AKRI_LOG_LEVEL"], agent["AKRI_LOG_FORMAT"]) == ("debug", "json")
    assert agent["S_Y"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    controller = env_of(containers["akri-controller-deployment"])
    assert (controller["AKRI_LOG_LEVEL"], controller["AKRI_LOG_FORMAT"]) == ("WARNING", "json")
    assert controller["S_X"] == "1"
    udev = env_of(containers["akri-udev-discovery-daemonset"])
    assert (udev["AKRI_LOG_LEVEL"], udev["AKRI_LOG_FORMAT"]) == ("debug", "text")
    assert pod_spec(one(objects, "DaemonSet", "akri-udev-discovery-daemonset"))["tolerations"] == [
        TOLERATION
    ]
    for container in containers.values():  # the webhook and the hook too
        assert env_of(container)["AKRI_LOG_LEVEL"] in ("debug", "WARNING")
    default = {o["metadata"]["name"]: pod_spec(o)["containers"][0] for o in workloads(render())}
    assert not any("AKRI_LOG_LEVEL" in env_of(c) for c in default.values())


def test_upstream_default_tolerations_map_adds_none() -> None:
    """Upstream's values.yaml has `tolerations: { }`: no toleration, as there."""
    objects = render({"agent": {"tolerations": {}}, "controller": {"tolerations": {}}})
    assert "tolerations" not in pod_spec(one(objects, "DaemonSet", "akri-agent-daemonset"))
    ctl = pod_spec(one(objects, "Deployment", "akri-controller-deployment"))
    assert [t["key"] for t in ctl["tolerations"]] == ["node-role.kubernetes.io/control-plane"]
