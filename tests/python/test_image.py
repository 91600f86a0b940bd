"""The image the manifests run, built from this checkout and started with podman.

`.ci/run` builds it with `deploy/build-image.sh` (FROM scratch: no registry is reachable here) and
sets TOOLGATE_IMAGE to its tag; these tests then check what is in it, run it under the
restrictions a pod gives it (read-only root, user 65532, 64 MiB, no capabilities) and play the
demo overlay's Deployment with `podman kube play`. Outside CI, without TOOLGATE_IMAGE, they are
skipped; in CI a missing image fails them.

Workarounds for this machine, kept here and not in the image (found by hand, see the
`PODMAN_CONF` comment): podman's default runtime crun refuses this host's hybrid cgroups (runc
works), and setting RLIMIT_NOFILE/NPROC is not permitted here (so no default ulimits).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import grpc
import jwt
import pytest
import toolgate_process
import yaml
from conftest import ReflectedApi, _identity
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_deploy import BASE, OVERLAY, _agent_deployment, _one, render
from toolgate_process import REPO_ROOT

IMAGE = os.environ.get("TOOLGATE_IMAGE", "")
PODMAN_TIMEOUT_S = 120
FIXTURES = REPO_ROOT / "tests" / "fixtures"

pytestmark = pytest.mark.skipif(
    not IMAGE and not os.environ.get("CI"),
    reason="TOOLGATE_IMAGE not set: build it with deploy/build-image.sh (CI does)",
)


@pytest.fixture(scope="module")
def image() -> str:
    assert IMAGE, "TOOLGATE_IMAGE must name the image deploy/build-image.sh built"
    assert shutil.which("podman"), "podman is needed (apt-get install podman)"
    return IMAGE


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory) -> dict[str, str]:
    """podman's environment: a containers.conf with this machine's workarounds (module doc)."""
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n')
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S, env=env
    )
    if check:
        assert done.returncode == 0, f"podman {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def cargo_package() -> dict:
    import tomllib

    return tomllib.loads((REPO_ROOT / "Cargo.toml").read_text())["package"]


# --- what is in it ---------------------------------------------------------------------------------


def test_the_image_holds_the_binary_the_libraries_it_links_and_nothing_else(image, podman_env, tmp_path):
    created = podman(podman_env, "create", image).stdout.strip()
    try:
        exported = tmp_path / "image.tar"
        podman(podman_env, "export", "--output", str(exported), created)
    finally:
        podman(podman_env, "rm", created)
    with tarfile.open(exported) as tar:
        members = {m.name.lstrip("./"): m for m in tar.getmembers() if m.name.strip("./")}
        tar.extract("usr/local/bin/toolgate", tmp_path, filter="data")
    files = {name for name, m in members.items() if not m.isdir()}
    # The libraries the image's own binary needs, as the loader resolves them on this machine.
    linked = subprocess.run(
        ["ldd", str(tmp_path / "usr/local/bin/toolgate")], capture_output=True, text=True, check=True
    ).stdout
    libraries = set()
    for line in linked.splitlines():
        parts = line.split()
        if "=>" in parts and parts[parts.index("=>") + 1].startswith("/"):
            libraries.add(parts[parts.index("=>") + 1].lstrip("/"))
        elif parts and parts[0].startswith("/"):
            libraries.add(parts[0].lstrip("/"))
    assert libraries, linked
    assert files == {
        "usr/local/bin/toolgate",
        "etc/passwd",
        "etc/group",
        "etc/ssl/certs/ca-certificates.crt",
        "usr/share/doc/toolgate/sbom.cdx.json",
        *libraries,
    }, "the image holds exactly the binary, its libraries, the CA bundle, the user and the SBOM"
    assert "bin/sh" not in members and "usr/bin/sh" not in members
    assert members["run/toolgate"].uid == 65532, "the socket directory belongs to the user"
    assert members["usr/local/bin/toolgate"].uid == 0, "the binary is not the user's to change"

    inspected = json.loads(podman(podman_env, "image", "inspect", image).stdout)[0]
    config = inspected["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["/usr/local/bin/toolgate", "serve"]
    labels = config["Labels"]
    package = cargo_package()
    revision = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert labels["org.opencontainers.image.version"] == package["version"]
    assert labels["org.opencontainers.image.licenses"] == package["license"]
    assert labels["org.opencontainers.image.revision"] == revision
    assert labels["org.opencontainers.image.source"]


def test_the_sbom_lists_what_the_lock_file_pins(image, podman_env, tmp_path):
    import tomllib

    created = podman(podman_env, "create", image).stdout.strip()
    try:
        podman(podman_env, "cp", f"{created}:/usr/share/doc/toolgate/sbom.cdx.json", str(tmp_path))
    finally:
        podman(podman_env, "rm", created)
    sbom = json.loads((tmp_path / "sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX" and sbom["specVersion"] == "1.5"
    assert sbom["metadata"]["component"]["name"] == "toolgate"
    pinned = {
        (p["name"], p["version"]): p.get("checksum")
        for p in tomllib.loads((REPO_ROOT / "Cargo.lock").read_text())["package"]
    }
    listed = {(c["name"], c["version"]): c for c in sbom["components"]}
    for name in ("tonic", "tokio", "jsonschema", "serde_json", "rustls"):
        found = [key for key in listed if key[0] == name]
        assert found, f"{name} is linked into toolgate but not in the SBOM"
        for key in found:
            assert key in pinned, f"{key} is not what Cargo.lock pins"
            assert listed[key]["hashes"][0]["content"] == pinned[key]
            assert listed[key]["purl"] == f"pkg:cargo/{key[0]}@{key[1]}"
    # Dev-dependencies are not shipped.
    assert not [key for key in listed if key[0] in ("divan", "proptest", "hdrhistogram")]


def test_the_manifests_run_the_tag_the_script_builds(image):
    version = cargo_package()["version"]
    assert image.endswith(f"toolgate:{version}"), image
    sidecar = next(c for c in _agent_deployment(render(BASE))["spec"]["template"]["spec"]["initContainers"])
    assert sidecar["image"] == f"toolgate:{version}"
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    renamed = next(i for i in kustomization["images"] if i["name"] == "toolgate")
    assert renamed["newTag"] == version


# --- running it as a pod would ---------------------------------------------------------------------


def _restricted_run(name: str, catalog_dir: Path) -> list[str]:
    return [
        "podman", "run", "--rm", "--name", name,
        "--read-only", "--user", "65532:65532", "--memory", "64m",
        "--cap-drop", "all", "--security-opt", "no-new-privileges",
        "--network", "host",
        # As the manifests mount the ConfigMap: the directory, read-only.
        "--volume", f"{catalog_dir}:/etc/toolgate:ro",
        IMAGE, "--config", "/etc/toolgate/catalog.yaml",
    ]


def _admin_addr(server: toolgate_process.ToolgateServer) -> str:
    for line in server.stderr_lines:
        fields = toolgate_process._log_message(line) or {}
        if fields.get("message") == "serving /metrics, /healthz and /readyz":
            return fields["addr"]
    raise AssertionError(f"no admin address logged:\n{server.stderr_text()}")


def test_the_image_runs_read_only_as_65532_in_64_mib_and_serves_calls(image, podman_env, tmp_path, monkeypatch):
    catalog_dir = tmp_path / "catalog"
    catalog_dir.mkdir()
    shutil.copy(REPO_ROOT / "examples" / "demo.yaml", catalog_dir / "catalog.yaml")
    for key, value in podman_env.items():
        monkeypatch.setenv(key, value)
    name = f"toolgate-test-{os.getpid()}"
    server = toolgate_process.start(command=_restricted_run(name, catalog_dir))
    try:
        # What podman was told is what the container got.
        state = json.loads(podman(podman_env, "inspect", name).stdout)[0]
        assert state["HostConfig"]["ReadonlyRootfs"] is True
        assert state["HostConfig"]["Memory"] == 64 * 1024 * 1024
        assert state["Config"]["User"] == "65532:65532"
        assert not state.get("EffectiveCaps"), state.get("EffectiveCaps")

        with grpc.insecure_channel(server.address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            with urllib.request.urlopen(f"http://{_admin_addr(server)}/readyz", timeout=10) as ready:
                assert ready.status == 200
            api = ReflectedApi(channel)
            list_request, list_tools = api.unary("toolgate.v1.ToolGate", "ListTools")
            listed = list_tools(list_request(), metadata=_identity(), timeout=10)
            assert "echo" in [tool.name for tool in listed.tools]
            execute_request, execute = api.unary("toolgate.v1.ToolGate", "ExecuteTool")
            request = execute_request()
            request.call.name = "echo"
            request.call.arguments_json = json.dumps({"text": "from the image"})
            request.call.call_id = "image-1"
            result = execute(request, metadata=_identity(), timeout=10).result
            assert result.model_text == "from the image", result
        mine = lambda events: [e for e in events if e.get("call_id") == "image-1"]
        events = mine(server.wait_for_audit_events(mine))
        assert events[0]["status"] == "OK", events
    finally:
        started = time.monotonic()
        code = toolgate_process.stop(server)
    assert code == 0, f"exit {code} after SIGTERM:\n{server.stderr_text()}"
    # Nothing was in flight: it ends within the catalog's shutdown grace.
    grace = yaml.safe_load((catalog_dir / "catalog.yaml").read_text())["server"]["shutdown_grace"]
    assert grace.endswith("s") and time.monotonic() - started < float(grace[:-1]), grace


def test_a_broken_catalog_stops_the_image_with_the_error_in_its_log(image, podman_env, tmp_path):
    catalog_dir = tmp_path / "catalog"
    catalog_dir.mkdir()
    (catalog_dir / "catalog.yaml").write_text("version: 1\ntools:\n  - name: broken\n")
    done = subprocess.run(
        _restricted_run(f"toolgate-broken-{os.getpid()}", catalog_dir),
        capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S, env=podman_env,
    )
    assert done.returncode != 0
    assert "/etc/toolgate/catalog.yaml" in done.stderr and "tools[0]" in done.stderr, done.stderr


# --- the deployment, played --------------------------------------------------------------------------


def _playable(documents: list[dict]) -> tuple[list[dict], dict]:
    """The rendered demo overlay as podman 4.3's `kube play` runs it, and the Secret to create.

    Changed, each because podman does not do what a kubelet does (everything else as rendered):
    - the native sidecar (an init container with restartPolicy: Always) becomes a container: podman
      runs init containers to completion before the others, so a sidecar would block the pod;
    - the agent container is dropped: its image (your agent runtime) is not built here;
    - hostNetwork, so that this test, on the host, is a client in the pod's network; the container
      port list goes (podman refuses port mappings with host networking);
    - the ConfigMap mount loses `readOnly`: podman would then fail to create the mount point of the
      Secret nested inside it (a kubelet always mounts ConfigMaps read-only anyway);
    - the Secret's key is the test fixture's public key (the overlay's placeholder has no private
      half), given to podman as a podman secret holding the Secret, with its data as plain text and
      `optional` set on the volume (podman 4.3 reads it that way, and crashes on a missing flag);
    - Jaeger, the NetworkPolicy and the Namespace are not played (no images here; podman has no
      network policies or namespaces). The traces endpoint stays as rendered and goes unanswered.
    """
    deployment = _agent_deployment(documents)
    catalog = _one(documents, "ConfigMap", "toolgate-catalog")
    secret = _one(documents, "Secret", "toolgate-jwt-keys")
    pod = deployment["spec"]["template"]["spec"]
    sidecar = next(c for c in pod.pop("initContainers") if c["name"] == "toolgate")
    sidecar.pop("restartPolicy")
    sidecar.pop("ports", None)
    for mount in sidecar["volumeMounts"]:
        if mount["mountPath"] == "/etc/toolgate":
            mount.pop("readOnly", None)
    pod["containers"] = [sidecar]
    pod["hostNetwork"] = True
    used = {m["name"] for m in sidecar["volumeMounts"]}
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] in used]
    for volume in pod["volumes"]:
        if "secret" in volume:
            volume["secret"]["optional"] = False
    secret = {
        **{k: v for k, v in secret.items() if k not in ("data", "stringData")},
        "data": {"jwt-public.pem": (FIXTURES / "ec_public.pem").read_text()},
    }
    return [catalog, deployment], secret


def test_the_demo_overlay_plays_as_a_pod_that_serves_its_probes_and_a_call(image, podman_env, tmp_path):
    documents = render(OVERLAY)
    rendered_catalog = yaml.safe_load(_one(documents, "ConfigMap", "toolgate-catalog")["data"]["catalog.yaml"])
    sidecar = next(
        c for c in _agent_deployment(documents)["spec"]["template"]["spec"]["initContainers"]
        if c["name"] == "toolgate"
    )
    podman(podman_env, "tag", image, sidecar["image"])
    playable, secret = _playable(documents)
    kube = tmp_path / "pod.yaml"
    kube.write_text(yaml.safe_dump_all(playable))
    (tmp_path / "secret.yaml").write_text(yaml.safe_dump(secret))
    secret_name = secret["metadata"]["name"]
    podman(podman_env, "secret", "rm", secret_name, check=False)
    podman(podman_env, "secret", "create", secret_name, str(tmp_path / "secret.yaml"))
    volumes = ("toolgate-catalog", "toolgate-jwt-keys", "toolgate-socket")
    try:
        podman(podman_env, "kube", "play", str(kube))
        # podman names it <deployment>-pod[-N]-<container>.
        names = podman(podman_env, "ps", "--all", "--format", "{{.Names}}").stdout.split()
        [container] = [n for n in names if n.startswith("agent-pod") and n.endswith("-toolgate")]
        # The probes' endpoint: gRPC health on the port the probes name.
        port = sidecar["startupProbe"]["grpc"]["port"]
        address = f"127.0.0.1:{port}"
        with grpc.insecure_channel(address) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=10, wait_for_ready=True
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            jwt_config = rendered_catalog["identity"]["jwt"]
            token = jwt.encode(
                {
                    "iss": jwt_config["issuer"][0],
                    "aud": jwt_config["audience"][0],
                    "sub": "played-pod-test",
                    "tenant": "acme",
                    "agent": "support-bot",
                    "exp": int(time.time()) + 300,
                },
                (FIXTURES / "ec_private.pem").read_text(),
                algorithm="ES256",
            )
            metadata = (("authorization", f"Bearer {token}"),)
            api = ReflectedApi(channel)
            execute_request, execute = api.unary("toolgate.v1.ToolGate", "ExecuteTool")
            request = execute_request()
            request.call.name = "echo"
            request.call.arguments_json = json.dumps({"text": "from the pod"})
            request.call.call_id = "pod-1"
            result = execute(request, metadata=metadata, timeout=10).result
            assert result.model_text == "from the pod", result
            # Without a token, refused: the catalog's identity is what the ConfigMap holds.
            with pytest.raises(grpc.RpcError) as refused:
                execute(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        logs = podman(podman_env, "logs", container).stdout + podman(podman_env, "logs", container).stderr
        assert '"source":"/etc/toolgate/catalog.yaml"' in logs, "the ConfigMap's catalog, where mounted"
        assert "/run/toolgate/toolgate.sock" in logs, "the socket on the shared emptyDir"
        audit = [json.loads(line) for line in logs.splitlines() if line.startswith("{") and '"call_id"' in line]
        assert [e for e in audit if e.get("call_id") == "pod-1" and e.get("status") == "OK"], logs
    finally:
        podman(podman_env, "kube", "down", str(kube), check=False)
        podman(podman_env, "secret", "rm", secret_name, check=False)
        podman(podman_env, "volume", "rm", "--force", *volumes, check=False)
