"""The Helm chart k8s/helm/akri-trio, linted and rendered by Helm's own engine: which objects each
values key makes, the hardening every Pod gets, and that upstream Akri's values keys mean here
what they mean there. Installing it on the node is tests/deploy/test_pods.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from akri_trio.webhook.certs import webhook_configuration
from akri_trio_dev.cluster.layout import K8S_RELEASES
from tests.support.chart import CHART, by_kind, crds, env_of, one, pod_spec, render, workloads

REPO = Path(__file__).resolve().parents[2]

# Every optional part on, as a values file of upstream Akri's shape would ask for it.
EVERYTHING: dict[str, Any] = {
    "agent": {"allowDebugEcho": True, "full": True},
    "webhookConfiguration": {"enabled": True},
    "prometheus": {"enabled": True},
    "debugEcho": {
        "configuration": {"enabled": True, "brokerPod": {"image": {"repository": "nginx"}}},
        "discovery": {"enabled": True, "useNetworkConnection": True},
    },
    "udev": {
        "configuration": {
            "enabled": True,
            "discoveryDetails": {"udevRules": ['KERNEL=="video[0-9]*"']},
            "brokerJob": {"image": {"repository": "busybox"}, "command": ["sh", "-c", "true"]},
        },
        "discovery": {"enabled": True},
    },
    "onvif": {"discovery": {"enabled": True}},
    "opcua": {"discovery": {"enabled": True}},
    "zeroconf": {"discovery": {"enabled": True}},
    "custom": {
        "configuration": {
            "enabled": True,
            "discoveryHandlerName": "mine",
            "discoveryDetails": "a: b",
        },
        "discovery": {"enabled": True, "image": {"repository": "me/handler"}},
    },
}
OVERRIDE = {"kubernetesApiOverride": {"enabled": True, "host": "127.0.0.1", "port": 16443}}


def kinds_and_names(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


@pytest.mark.parametrize("kube_version", K8S_RELEASES)
def test_lint_is_clean(kube_version: str) -> None:
    """On every supported release (the chart's kubeVersion admits them all)."""
    for values in ({}, EVERYTHING, OVERRIDE):
        report = helm_python.lint(CHART, values, strict=True, kube_version=kube_version)
        assert report["errors"] == []
        # severity 2 = warning, 3 = error; infos (e.g. "icon is recommended") are fine
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_defaults_make_the_agent_the_controller_the_webhook_and_the_cleanup_hook() -> None:
    objects = render()
    webhook = {
        (kind, name)
        for kind, name in kinds_and_names(objects)
        if name.startswith("akri-webhook") and kind != "ClusterRoleBinding"
    }
    assert webhook == {  # on by default, as upstream's
        ("ServiceAccount", "akri-webhook-sa"),
        ("ClusterRole", "akri-webhook-role"),
        ("ClusterRole", "akri-webhook-certs-role"),
        ("Role", "akri-webhook-certs"),
        ("RoleBinding", "akri-webhook-certs"),
        ("Deployment", "akri-webhook-configuration"),
        ("Service", "akri-webhook-configuration"),
        ("ValidatingWebhookConfiguration", "akri-webhook-configuration"),
    }
    objects = render({"webhookConfiguration": {"enabled": False}})
    assert kinds_and_names(objects) == {
        ("ServiceAccount", "akri-agent-sa"),
        ("ClusterRole", "akri-agent-role"),
        ("ClusterRoleBinding", "akri-agent-binding"),
        ("ClusterRole", "akri-agent-secrets-role"),
        ("ClusterRoleBinding", "akri-agent-secrets-binding"),
        ("DaemonSet", "akri-agent-daemonset"),
        ("ServiceAccount", "akri-controller-sa"),
        ("ClusterRole", "akri-controller-role"),
        ("ClusterRoleBinding", "akri-controller-binding"),
        ("Role", "akri-controller-lease"),
        ("RoleBinding", "akri-controller-lease"),
        ("Lease", "akri-controller"),
        ("Deployment", "akri-controller-deployment"),
        # draSwitchBack: what DRA mode left, deleted after a switch back
        ("ClusterRole", "akri-controller-dra-leftovers-role"),
        ("ClusterRoleBinding", "akri-controller-dra-leftovers-binding"),
        ("ServiceAccount", "akri-teardown-sa"),
        ("ClusterRole", "akri-teardown-role"),
        ("ClusterRoleBinding", "akri-teardown-binding"),
        ("Job", "akri-teardown"),
    }
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "akri"  # upstream's, its tooling's selector
        assert labels["app.kubernetes.io/instance"] == "akri"
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "akri"


def test_every_pod_is_locked_down() -> None:
    for obj in workloads(render({**EVERYTHING, **OVERRIDE})):
        spec = pod_spec(obj)
        name = obj["metadata"]["name"]
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            root = name == "akri-agent-daemonset"  # the kubelet's sockets are root's
            assert sc["runAsNonRoot"] is (not root), name
            assert sc["runAsUser"] == (0 if root else 65532), name
            assert "privileged" not in sc, name


def test_handlers_run_as_the_agents_handler_group_or_as_root_without_it() -> None:
    objects = render({**EVERYTHING, "agent": {"metricsHost": "10.1.2.3"}})
    agent = pod_spec(one(objects, "DaemonSet", "akri-agent-daemonset"))
    assert agent["securityContext"]["supplementalGroups"] == [65532]
    env = env_of(agent["containers"][0])
    assert env["AKRI_HANDLER_GROUP"] == "65532" and env["METRICS_HOST"] == "10.1.2.3"
    handlers = [
        o for o in by_kind(objects, "DaemonSet").values()
        if o["metadata"]["name"] != "akri-agent-daemonset"
    ]  # fmt: skip
    assert len(handlers) == 6
    for ds in handlers:
        (c,) = pod_spec(ds)["containers"]
        sc = c["securityContext"]
        assert (sc["runAsNonRoot"], sc["runAsUser"], sc["runAsGroup"]) == (True, 65532, 65532)
        assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    as_root = render({**EVERYTHING, "agent": {"handlerGroup": ""}})
    agent = pod_spec(one(as_root, "DaemonSet", "akri-agent-daemonset"))
    assert "supplementalGroups" not in agent["securityContext"]
    assert "AKRI_HANDLER_GROUP" not in env_of(agent["containers"][0])
    udev = pod_spec(one(as_root, "DaemonSet", "akri-udev-discovery-daemonset"))
    assert udev["containers"][0]["securityContext"]["runAsUser"] == 0


def test_agent_daemonset() -> None:
    ds = one(render(), "DaemonSet", "akri-agent-daemonset")
    spec = pod_spec(ds)
    assert "hostNetwork" not in spec  # only when asked
    assert spec["serviceAccountName"] == "akri-agent-sa"
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    (agent,) = spec["containers"]
    # draSwitchBack: DRA mode's directories, where a switch back finds the claims it left
    assert agent["args"] == [
        "agent",
        "--kubelet-root-dir=/var/lib/kubelet",
        "--cdi-dir=/var/run/cdi",
    ]
    assert agent["image"] == "akri-trio:0.1.0"
    env = env_of(agent)
    assert env["AGENT_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["DISCOVERY_HANDLERS_DIRECTORY"] == "/var/lib/akri"
    assert "ENABLE_DEBUG_ECHO" not in env and "KUBERNETES_SERVICE_HOST" not in env
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in agent["volumeMounts"]}
    assert mounts == {
        "/var/lib/akri": False,
        "/var/lib/kubelet/device-plugins": False,
        "/var/lib/kubelet/pod-resources": True,
        "/run/udev": True,
        "/var/lib/kubelet/plugins_registry": False,
        "/var/lib/kubelet/plugins": False,
        "/var/run/cdi": False,
        "/tmp": False,
    }
    host = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host == {
        "/var/lib/akri",
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
        "/run/udev",
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
        "/var/run/cdi",
    }
    assert agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert agent["ports"] == [{"name": "metrics", "containerPort": 8080}]


def test_dra_allocation_switches_the_agent_and_the_controller() -> None:
    objects = render({"allocation": "dra"})
    ds = one(objects, "DaemonSet", "akri-agent-daemonset")
    spec = pod_spec(ds)
    (agent,) = spec["containers"]
    assert agent["args"] == [
        "agent",
        "--allocation=dra",
        "--kubelet-root-dir=/var/lib/kubelet",
        "--cdi-dir=/var/run/cdi",
    ]
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    dra = {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi"}
    assert dra <= mounts
    assert dra <= {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    (controller,) = pod_spec(one(objects, "Deployment", "akri-controller-deployment"))["containers"]
    assert "--allocation=dra" in controller["args"]
    # The default is upstream's device plugins: neither gets the flag. The agent keeps DRA
    # mode's directories for a switch back (draSwitchBack), and without it has none of them.
    dirs = {"--kubelet-root-dir=/var/lib/kubelet", "--cdi-dir=/var/run/cdi"}
    for switch_back, mounted in ((True, dra), (False, set())):
        default = render({"draSwitchBack": switch_back})
        (agent,) = pod_spec(one(default, "DaemonSet", "akri-agent-daemonset"))["containers"]
        assert "--allocation=dra" not in agent["args"]
        assert (dirs <= set(agent["args"])) is switch_back
        assert dra & {m["mountPath"] for m in agent["volumeMounts"]} == mounted
        (controller,) = pod_spec(one(default, "Deployment", "akri-controller-deployment"))[
            "containers"
        ]
        assert "--allocation=dra" not in controller["args"]
    with pytest.raises(helm_python.HelmError, match="allocation must be device-plugin or dra"):
        render({"allocation": "dynamic"})


def test_handler_mount_dirs_reach_the_agent() -> None:
    values = {"agent": {"handlerMountDirs": ["/srv/cams", "/opt/models"]}}
    ds = one(render(values), "DaemonSet", "akri-agent-daemonset")
    (agent,) = pod_spec(ds)["containers"]
    assert env_of(agent)["AKRI_HANDLER_MOUNT_DIRS"] == "/srv/cams,/opt/models"
    (default,) = pod_spec(one(render(), "DaemonSet", "akri-agent-daemonset"))["containers"]
    assert "AKRI_HANDLER_MOUNT_DIRS" not in env_of(default)


def test_broker_info_in_dra_mode_may_write_its_driver_s_claim_status() -> None:
    objs = render({"allocation": "dra", "agent": {"brokerInfoDirectory": "/var/lib/akri-bi"}})
    rules = one(objs, "ClusterRole", "akri-agent-dra-role")["rules"]
    assert {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims/driver"],
        "resourceNames": ["akri.sh"],
        "verbs": ["associated-node:patch", "arbitrary-node:patch"],
    } in rules
    assert {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims/status"],
        "verbs": ["patch"],
    } in rules
    (agent,) = pod_spec(one(objs, "DaemonSet", "akri-agent-daemonset"))["containers"]
    assert env_of(agent)["BROKER_INFO_DIRECTORY"] == "/var/lib/akri-bi"


@pytest.mark.parametrize("allocation", ["device-plugin", "dra"])
def test_broker_info_directory_is_mounted_at_its_own_path(allocation: str) -> None:
    ds = one(
        render(
            {
                "allocation": allocation,
                "agent": {"brokerInfoDirectory": "/var/lib/akri-broker-info"},
            }
        ),
        "DaemonSet",
        "akri-agent-daemonset",
    )
    spec = pod_spec(ds)
    (agent,) = spec["containers"]
    assert env_of(agent)["BROKER_INFO_DIRECTORY"] == "/var/lib/akri-broker-info"
    assert {"name": "broker-info", "mountPath": "/var/lib/akri-broker-info"} in agent[
        "volumeMounts"
    ]
    volume = next(v for v in spec["volumes"] if v["name"] == "broker-info")
    assert volume["hostPath"]["path"] == "/var/lib/akri-broker-info"


def test_agent_full_debug_echo_and_host_network() -> None:
    (agent_ds,) = [o for o in render(EVERYTHING) if o["metadata"]["name"] == "akri-agent-daemonset"]
    spec = pod_spec(agent_ds)
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    env = env_of(spec["containers"][0])
    assert env["AKRI_EMBEDDED_HANDLERS"] == "udev,onvif,opcua,zeroconf"
    assert env["ENABLE_DEBUG_ECHO"] == "1"
    assert env["DEBUG_ECHO_INSTANCES_SHARED"] == "true"
    # allowDebugEcho alone embeds nothing: upstream's default agent has no embedded handlers
    slim = pod_spec(
        one(render({"agent": {"allowDebugEcho": True}}), "DaemonSet", "akri-agent-daemonset")
    )
    assert not {"ENABLE_DEBUG_ECHO", "AKRI_EMBEDDED_HANDLERS"} & set(env_of(slim["containers"][0]))
    only_host = pod_spec(
        one(render({"agent": {"hostNetwork": True}}), "DaemonSet", "akri-agent-daemonset")
    )
    assert only_host["hostNetwork"] is True
    assert "AKRI_EMBEDDED_HANDLERS" not in env_of(only_host["containers"][0])
    scoped = pod_spec(
        one(
            render({"agent": {"watchNamespace": "team-a", "metricsPort": 18080}}),
            "DaemonSet",
            "akri-agent-daemonset",
        )
    )["containers"][0]
    assert env_of(scoped)["AKRI_NAMESPACE"] == "team-a"
    assert env_of(scoped)["METRICS_PORT"] == "18080"
    assert scoped["ports"][0]["containerPort"] == 18080


def test_agent_rbac_is_the_tested_manifests() -> None:
    """The chart's agent and webhook roles, and DRA mode's of the agent and the controller (with
    `allocation: dra`), are the ones their RBAC tests run with."""
    objects = render({"webhookConfiguration": {"enabled": True}, "allocation": "dra"})
    for manifest, role in (
        ("agent.yaml", "akri-agent-role"),
        ("dra.yaml", "akri-agent-dra-role"),
        ("webhook.yaml", "akri-webhook-role"),
    ):
        docs = list(yaml.safe_load_all((REPO / "k8s" / manifest).read_text()))
        tested = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
        assert role in tested
        for name, cluster_role in tested.items():
            assert one(objects, "ClusterRole", name)["rules"] == cluster_role["rules"]
        for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
            rendered = one(objects, "ClusterRoleBinding", binding["metadata"]["name"])
            assert rendered["roleRef"] == binding["roleRef"]


def _dra_rules(objects: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    """The rules of `component`'s ClusterRoles on DRA's API group."""
    return [
        rule
        for obj in objects
        if obj["kind"] == "ClusterRole" and component in obj["metadata"]["name"]
        for rule in obj["rules"]
        if "resource.k8s.io" in rule["apiGroups"]
    ]


def test_only_dra_mode_may_write_resource_slices() -> None:
    """In device-plugin mode (the default) no role of the agent or the controller makes or
    changes anything of DRA's API group: ResourceSlices, claims, DeviceClasses, claim
    templates. The controller may only list and delete DeviceClasses and ResourceSlices, to
    delete those DRA mode left after a switch back (draSwitchBack), and without draSwitchBack
    nothing of DRA's at all."""
    for values, granted in (({"draSwitchBack": False}, False), ({"allocation": "dra"}, True)):
        for component in ("agent", "controller"):
            rules = _dra_rules(render(values), component)
            resources = {resource for rule in rules for resource in rule["resources"]}
            assert ("resourceslices" in resources) is granted, component
            assert bool(resources) is granted, component
    default = render()
    assert _dra_rules(default, "agent") == []
    assert _dra_rules(default, "controller") == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["deviceclasses", "resourceslices"],
            "verbs": ["list", "delete"],
        }
    ]


def test_agent_secrets_are_readable_everywhere_or_per_namespace() -> None:
    """Secrets and ConfigMaps apart from the rest: a RoleBinding per rbac.secretsNamespaces
    entry, else one ClusterRoleBinding (k8s/agent.yaml's)."""
    everywhere = render()
    role = one(everywhere, "ClusterRole", "akri-agent-secrets-role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get"]}
    ]
    rules = one(everywhere, "ClusterRole", "akri-agent-role")["rules"]
    assert not any("secrets" in r["resources"] for r in rules)
    binding = one(everywhere, "ClusterRoleBinding", "akri-agent-secrets-binding")
    assert binding["roleRef"]["name"] == "akri-agent-secrets-role"
    assert "akri-agent-secrets" not in by_kind(everywhere, "RoleBinding")
    scoped = render({"rbac": {"secretsNamespaces": ["team-a", "team-b"]}})
    bindings = [
        o
        for o in scoped
        if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "akri-agent-secrets"
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "akri-agent-secrets-role",
        }
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "akri-agent-sa", "namespace": "akri"}
        ]
    assert "akri-agent-secrets-binding" not in by_kind(scoped, "ClusterRoleBinding")


def test_api_override_puts_api_clients_on_the_host_network() -> None:
    objects = render({**EVERYTHING, **OVERRIDE})
    api_clients = {
        "akri-agent-daemonset",
        "akri-controller-deployment",
        "akri-webhook-configuration",
        "akri-teardown",
    }
    for obj in workloads(objects):
        spec = pod_spec(obj)
        env = env_of(spec["containers"][0])
        if obj["metadata"]["name"] in api_clients:
            assert spec["hostNetwork"] is True
            assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
            assert env["KUBERNETES_SERVICE_PORT"] == "16443"
        else:  # handlers talk only to the agent
            assert "KUBERNETES_SERVICE_HOST" not in env
            assert spec["automountServiceAccountToken"] is False
    for obj in workloads(render()):
        assert "KUBERNETES_SERVICE_HOST" not in env_of(pod_spec(obj)["containers"][0])


def test_controller_two_replicas_with_leader_election() -> None:
    objects = render()
    deploy = one(objects, "Deployment", "akri-controller-deployment")
    assert deploy["spec"]["replicas"] == 2
    spec = pod_spec(deploy)
    assert spec["serviceAccountName"] == "akri-controller-sa"
    (c,) = spec["containers"]
    assert c["args"] == ["controller", "--leader-elect"]
    env = env_of(c)
    assert env["METRICS_PORT"] == "8080"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # holder identity
    assert c["ports"] == [{"name": "metrics", "containerPort": 8080}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # the Lease the controller looks for in its own namespace (the release's), and only it
    lease = one(objects, "Role", "akri-controller-lease")
    assert lease["metadata"]["namespace"] == "akri"
    assert lease["rules"][1] == {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["akri-controller"],
        "verbs": ["get", "update"],
    }
    # the release's own, free: uninstall removes it
    assert one(objects, "Lease", "akri-controller")["spec"] == {}
    binding = one(objects, "RoleBinding", "akri-controller-lease")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "akri-controller-sa", "namespace": "akri"}
    ]
    single = pod_spec(
        one(
            render(
                {
                    "controller": {
                        "leaderElect": False,
                        "watchNamespace": "x",
                        "replicas": 1,
                        "metricsPort": 18081,
                    }
                }
            ),
            "Deployment",
            "akri-controller-deployment",
        )
    )["containers"][0]
    assert single["args"] == ["controller", "--no-leader-elect", "--namespace=x"]
    assert not by_kind(render({"controller": {"leaderElect": False}}), "Lease")
    assert env_of(single)["METRICS_PORT"] == "18081"
    assert single["ports"] == [{"name": "metrics", "containerPort": 18081}]
    assert not [
        o
        for o in render({"controller": {"enabled": False}})
        if "controller" in o["metadata"]["name"]
    ]


def _rules(role: dict[str, Any]) -> list[str]:
    """A role's rules in a canonical order (the order of rules grants nothing)."""
    return sorted(yaml.safe_dump(rule, sort_keys=True) for rule in role["rules"])


def test_controller_rbac_is_the_tested_manifest() -> None:
    """The chart's controller roles, cluster-wide (with draSwitchBack's, for what DRA mode left)
    and for its Lease, are k8s/controller.yaml's, which tests/controller/test_controller_rbac.py
    runs the controller with."""
    objects = render()
    docs = list(yaml.safe_load_all((REPO / "k8s" / "controller.yaml").read_text()))
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    assert set(roles) == {
        ("ClusterRole", "akri-controller-role"),
        ("ClusterRole", "akri-controller-dra-leftovers-role"),
        ("Role", "akri-controller-lease"),
    }
    for (kind, role), tested in roles.items():
        assert _rules(one(objects, kind, role)) == _rules(tested), role


def test_webhook_makes_and_renews_its_own_certificate_and_a_render_makes_none() -> None:
    """No certificate in the chart's output (a render, `helm template` or GitOps, changes
    nothing): the webhook makes it in its Secret, renews it and keeps the caBundle, with
    exactly the rights that takes."""
    objects = render()
    assert render() == objects  # deterministic
    assert not by_kind(objects, "Secret")
    vwc = one(objects, "ValidatingWebhookConfiguration", "akri-webhook-configuration")
    (hook,) = vwc["webhooks"]
    assert "caBundle" not in hook["clientConfig"]  # the webhook sets it
    # the same registration `akri-trio webhook certs` writes, but for the name and the CA
    (expected,) = webhook_configuration(
        "akri-webhook-configuration.akri.sh", b"", service=("akri-webhook-configuration", "akri")
    )["webhooks"]
    del expected["clientConfig"]["caBundle"]
    # the chart's sample Configurations are created with it, before it answers: not sent to it
    sample = {"key": "akri-trio.akri.sh/chart-sample", "operator": "DoesNotExist"}
    assert hook == {**expected, "objectSelector": {"matchExpressions": [sample]}}
    config = one(
        render({"udev": {"configuration": {"enabled": True}}}), "Configuration", "akri-udev"
    )
    assert config["metadata"]["labels"]["akri-trio.akri.sh/chart-sample"] == "akri"
    deploy = one(objects, "Deployment", "akri-webhook-configuration")
    (c,) = pod_spec(deploy)["containers"]
    assert c["args"] == [
        "webhook",
        "--tls-secret=akri-webhook-configuration-tls",
        "--manage-certs",
        "--webhook-configuration=akri-webhook-configuration",
        "--service=akri-webhook-configuration",
        "--cert-days=365",
        "--port=8443",
    ]
    assert env_of(c)["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert "volumes" not in pod_spec(deploy) or all(
        "secret" not in v for v in pod_spec(deploy)["volumes"]
    )
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    service = one(objects, "Service", "akri-webhook-configuration")
    assert service["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert one(objects, "Role", "akri-webhook-certs")["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["akri-webhook-configuration-tls"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    assert one(objects, "ClusterRole", "akri-webhook-certs-role")["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": ["akri-webhook-configuration"],
            "verbs": ["get", "patch"],
        }
    ]


def test_webhook_by_url_with_a_given_ca_or_cert_manager() -> None:
    objects = render(
        {
            "webhookConfiguration": {
                "url": "https://127.0.0.1:18443/validate",
                "certIPs": ["127.0.0.1"],
                "certDays": 30,
            }
        }
    )
    (c,) = pod_spec(one(objects, "Deployment", "akri-webhook-configuration"))["containers"]
    assert "--cert-ip=127.0.0.1" in c["args"] and "--cert-days=30" in c["args"]
    (hook,) = one(objects, "ValidatingWebhookConfiguration", "akri-webhook-configuration")[
        "webhooks"
    ]
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:18443/validate"
    assert "service" not in hook["clientConfig"]
    scoped = render(
        {
            "webhookConfiguration": {
                "namespaceSelector": {"matchLabels": {"team": "a"}},
                "failurePolicy": "Ignore",
            }
        }
    )
    (hook,) = one(scoped, "ValidatingWebhookConfiguration", "akri-webhook-configuration")[
        "webhooks"
    ]
    assert hook["namespaceSelector"] == {"matchLabels": {"team": "a"}}
    assert hook["failurePolicy"] == "Ignore"
    # the user's certificate: the webhook only follows its Secret, and may only read it
    given = render({"webhookConfiguration": {"caBundle": "Q0E=", "tlsSecretName": "mine"}})
    (hook,) = one(given, "ValidatingWebhookConfiguration", "akri-webhook-configuration")["webhooks"]
    assert hook["clientConfig"]["caBundle"] == "Q0E="
    (c,) = pod_spec(one(given, "Deployment", "akri-webhook-configuration"))["containers"]
    assert c["args"] == ["webhook", "--tls-secret=mine", "--port=8443"]
    assert one(given, "Role", "akri-webhook-certs")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mine"], "verbs": ["get"]}
    ]
    assert "akri-webhook-certs-role" not in by_kind(given, "ClusterRole")
    # cert-manager: a Certificate (self-signed Issuer unless one is named), its CA injected
    managed = render({"webhookConfiguration": {"certManager": {"enabled": True}, "certDays": 90}})
    certificate = one(managed, "Certificate", "akri-webhook-configuration")["spec"]
    assert certificate["secretName"] == "akri-webhook-configuration-tls"
    assert certificate["dnsNames"] == [
        "akri-webhook-configuration",
        "akri-webhook-configuration.akri",
        "akri-webhook-configuration.akri.svc",
    ]
    assert (certificate["duration"], certificate["renewBefore"]) == ("2160h", "720h")
    assert certificate["issuerRef"] == {
        "name": "akri-webhook-configuration-issuer",
        "kind": "Issuer",
    }
    assert one(managed, "Issuer", "akri-webhook-configuration-issuer")["spec"] == {"selfSigned": {}}
    vwc = one(managed, "ValidatingWebhookConfiguration", "akri-webhook-configuration")
    assert vwc["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "akri/akri-webhook-configuration"
    }
    (c,) = pod_spec(one(managed, "Deployment", "akri-webhook-configuration"))["containers"]
    assert "--manage-certs" not in c["args"]
    named = {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    other = render({"webhookConfiguration": {"certManager": {"enabled": True, "issuerRef": named}}})
    assert one(other, "Certificate", "akri-webhook-configuration")["spec"]["issuerRef"] == named
    assert not by_kind(other, "Issuer")


def test_a_daemonset_per_enabled_discovery_handler() -> None:
    objects = render(EVERYTHING)
    daemonsets = by_kind(objects, "DaemonSet")
    assert set(daemonsets) == {
        "akri-agent-daemonset",
        "akri-debug-echo-discovery-daemonset",
        "akri-udev-discovery-daemonset",
        "akri-onvif-discovery-daemonset",
        "akri-opcua-discovery-daemonset",
        "akri-zeroconf-discovery-daemonset",
        "akri-custom-discovery-daemonset",
    }
    echo = pod_spec(daemonsets["akri-debug-echo-discovery-daemonset"])
    (c,) = echo["containers"]
    assert c["args"] == ["discovery-handler", "debugEcho"]
    env = env_of(c)
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}  # useNetworkConnection
    assert c["ports"] == [{"name": "discovery", "containerPort": 10000}]
    assert env["DEBUG_ECHO_INSTANCES_SHARED"] == "true"
    assert "hostNetwork" not in echo
    udev = pod_spec(daemonsets["akri-udev-discovery-daemonset"])
    assert udev["hostNetwork"] is True  # netlink uevents
    assert "POD_IP" not in env_of(udev["containers"][0])  # over the socket
    assert {"name": "udev", "mountPath": "/run/udev", "readOnly": True} in udev["containers"][0][
        "volumeMounts"
    ]
    custom = pod_spec(daemonsets["akri-custom-discovery-daemonset"])["containers"][0]
    assert custom["image"] == "me/handler:latest" and "args" not in custom
    other_port = render(
        {"opcua": {"discovery": {"enabled": True, "useNetworkConnection": True, "port": 10001}}}
    )
    (c,) = pod_spec(one(other_port, "DaemonSet", "akri-opcua-discovery-daemonset"))["containers"]
    assert c["args"] == ["discovery-handler", "opcua", "--network=$(POD_IP):10001"]


def test_sample_configurations_map_upstream_fields() -> None:
    configurations = by_kind(render(EVERYTHING), "Configuration")
    assert set(configurations) == {"akri-debug-echo", "akri-udev", "akri-custom"}
    echo = configurations["akri-debug-echo"]["spec"]
    assert echo["discoveryHandler"]["name"] == "debugEcho"
    assert yaml.safe_load(echo["discoveryHandler"]["discoveryDetails"]) == {
        "descriptions": ["foo0", "foo1"]
    }
    assert echo["capacity"] == 2
    (broker,) = echo["brokerSpec"]["brokerPodSpec"]["containers"]
    assert broker["image"] == "nginx:latest"
    assert broker["resources"]["limits"]["{{PLACEHOLDER}}"] == "1"
    assert echo["instanceServiceSpec"]["ports"][0]["port"] == 6052
    assert echo["configurationServiceSpec"]["type"] == "ClusterIP"
    udev = configurations["akri-udev"]["spec"]
    assert yaml.safe_load(udev["discoveryHandler"]["discoveryDetails"]) == {
        "udevRules": ['KERNEL=="video[0-9]*"'],
        "groupRecursive": False,
        "permissions": "rwm",
    }
    job = udev["brokerSpec"]["brokerJobSpec"]
    assert job["backoffLimit"] == 2
    assert job["template"]["spec"]["containers"][0]["command"] == ["sh", "-c", "true"]
    assert "instanceServiceSpec" not in udev  # Services front broker Pods only
    custom = configurations["akri-custom"]["spec"]
    assert custom["discoveryHandler"] == {"name": "mine", "discoveryDetails": "a: b"}
    assert "brokerSpec" not in custom
    with pytest.raises(helm_python.HelmError, match="discoveryHandlerName"):
        render({"custom": {"configuration": {"enabled": True}}})


def test_podmonitors_select_the_metrics_ports() -> None:
    objects = render({"prometheus": {"enabled": True}})
    monitors = by_kind(objects, "PodMonitor")
    assert set(monitors) == {"akri-agent-metrics", "akri-controller-metrics"}
    agent = one(objects, "DaemonSet", "akri-agent-daemonset")
    selector = monitors["akri-agent-metrics"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= agent["spec"]["template"]["metadata"]["labels"].items()
    assert monitors["akri-agent-metrics"]["spec"]["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics"}
    ]


def test_cleanup_hook_is_a_pre_delete_job() -> None:
    job = one(render({"cleanupHook": {"namespaces": ["a", "b"]}}), "Job", "akri-teardown")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    (c,) = pod_spec(job)["containers"]
    assert c["args"] == ["teardown", "--timeout=120", "--namespace=a", "--namespace=b"]
    role = one(render(), "ClusterRole", "akri-teardown-role")
    assert role["rules"] == [
        {"apiGroups": ["akri.sh"], "resources": ["configurations"], "verbs": ["list", "delete"]},
        {"apiGroups": ["akri.sh"], "resources": ["instances"], "verbs": ["list"]},
    ]
    assert not by_kind(render({"cleanupHook": {"enabled": False}}), "Job")


def test_images_follow_the_top_level_image_unless_a_component_names_its_own() -> None:
    objects = render(
        {
            "image": {"repository": "localhost/akri-trio", "tag": "abc", "pullPolicy": "Never"},
            "controller": {"image": {"tag": "other"}},
        }
    )
    images = {o["metadata"]["name"]: pod_spec(o)["containers"][0] for o in workloads(objects)}
    assert images["akri-agent-daemonset"]["image"] == "localhost/akri-trio:abc"
    assert images["akri-agent-daemonset"]["imagePullPolicy"] == "Never"
    assert images["akri-controller-deployment"]["image"] == "localhost/akri-trio:other"


def test_upstream_image_keys() -> None:
    """useLatestContainers and agent.image.fullRepository do what upstream's do; the keys of
    upstream's separate images and certificate Job that akri-trio has no use for change
    nothing."""
    latest = render({"useLatestContainers": True, "agent": {"full": True}})
    (agent,) = pod_spec(one(latest, "DaemonSet", "akri-agent-daemonset"))["containers"]
    assert agent["image"] == "akri-trio:latest"
    full = {"agent": {"full": True, "image": {"fullRepository": "r/agent-full", "tag": "t"}}}
    (agent,) = pod_spec(one(render(full), "DaemonSet", "akri-agent-daemonset"))["containers"]
    assert agent["image"] == "r/agent-full:t"
    slim = {"agent": {"image": {"fullRepository": "r/agent-full", "tag": "t"}}}
    (agent,) = pod_spec(one(render(slim), "DaemonSet", "akri-agent-daemonset"))["containers"]
    assert agent["image"] == "akri-trio:t"  # fullRepository is for the full agent only
    nothing_to_do = {
        "useDevelopmentContainers": True,
        "webhookConfiguration": {
            "enabled": False,
            "ttlSecondsAfterFinished": 5,
            "certImage": {"reference": "x/certgen", "tag": "v1", "pullPolicy": "Always"},
        },
    }
    assert render(nothing_to_do) == render({"webhookConfiguration": {"enabled": False}})


def test_crds_are_the_repository_crds() -> None:
    ours = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "k8s" / "crds").glob("*.yaml"))]
    assert crds() == ours


def test_on_the_host_network_an_upgrade_replaces_pods_one_at_a_time() -> None:
    """A surge Pod on the host network would wait for the ports the Pod it replaces holds."""
    on = render({"kubernetesApiOverride": {"enabled": True, "host": "10.0.0.1", "port": 6443}})
    for name in ("akri-controller-deployment", "akri-webhook-configuration"):
        strategy = one(on, "Deployment", name)["spec"]["strategy"]
        assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
        assert "strategy" not in one(render(), "Deployment", name)["spec"]
