"""No Docker engine or cluster runs here, so check what can be checked: the Kubernetes manifests
validate against the Kubernetes API schemas (kubernetes-validate, strict) and carry what a
cluster needs (probes, requests and limits, headless Services, GPU scheduling, the shared chunk
directory, zones as fault domains); docker-compose.yml waits on health and runs the official
etcd and Redis images with commands that work (run here with the same servers' binaries; Redis's
TLS, which the bundled redis-server lacks, by the stack's own TLS front on the same files); every
container holds its own credentials only; every microco command they run is an entry point that
accepts exactly those arguments."""

from __future__ import annotations

import copy
import functools
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
IMAGE = "microco:0.1.0"


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: the pure-Python one is slow


@functools.cache
def _parsed(path: Path) -> list[Any]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]


def compose() -> dict:
    return copy.deepcopy(_parsed(REPO / "docker-compose.yml")[0])


def k8s_docs() -> list[dict]:
    """What `kubectl apply -k deploy/k8s` applies: the kustomization's resources, in its order,
    in its namespace (the base uses no patches or generators; the test below keeps it so)."""
    base = REPO / "deploy" / "k8s"
    kustomization = copy.deepcopy(_parsed(base / "kustomization.yaml")[0])
    assert set(kustomization) <= {"apiVersion", "kind", "namespace", "resources"}, kustomization
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(p.name for p in base.glob("*.yaml") if p.name != "kustomization.yaml")
    docs = []
    for name in listed:
        for d in copy.deepcopy(_parsed(base / name)):
            if d:
                if d["kind"] != "Namespace":
                    d["metadata"]["namespace"] = kustomization["namespace"]
                docs.append(d)
    return docs


def k8s_containers() -> list[dict]:
    out = []
    for doc in k8s_docs():
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        out += spec.get("initContainers", []) + spec.get("containers", [])
    return out


def argv_of(command: list[str]) -> list[str]:
    if command[:2] == ["sh", "-c"]:  # a variable the pod's environment sets stands for a value
        return ["node-a" if "$" in a else a for a in shlex.split(command[2].replace("exec ", "", 1))]
    return list(command)


def microco_services() -> dict[str, dict]:
    return {n: s for n, s in compose()["services"].items() if s.get("image") == IMAGE}


def all_commands() -> list[list[str]]:
    cmds = [argv_of(s["command"]) for s in microco_services().values()]
    cmds += [argv_of(c["command"]) for c in k8s_containers() if c["image"] == IMAGE]
    return cmds


def test_compose_runs_the_platform_and_waits_on_health() -> None:
    from microco.services.stack import StackOptions

    services = compose()["services"]
    assert {"etcd", "redis", "scheduler", "agent", "cache", "store", "compiler", "console"} <= set(services)
    # etcd and Redis from their official images, pinned; everything else from this repository's.
    assert services["etcd"]["image"].startswith("quay.io/coreos/etcd:v3.5.")
    assert services["redis"]["image"].startswith("redis:7.")
    ours = microco_services()
    assert set(ours) == set(services) - {"etcd", "redis"}
    one_shots = {"pki", "etcd-roles"}
    for name, svc in ours.items():
        assert svc["build"]["dockerfile"] == "deploy/docker/Dockerfile"
        assert svc["depends_on"].get("pki", {}) == (
            {} if name == "pki" else {"condition": "service_completed_successfully"}
        )
        if name in one_shots:
            continue
        assert svc["depends_on"]["etcd"] == {"condition": "service_healthy"}, name
        assert svc["depends_on"]["redis"] == {"condition": "service_healthy"}, name
        # etcd's roles are on before any service starts, and the scheduler adds its jobs' users
        assert svc["depends_on"]["etcd-roles"] == {"condition": "service_completed_successfully"}, name
        assert svc["environment"]["MICROCO_ETCD_ROLES"] == "1", name
    assert services["etcd-roles"]["depends_on"]["etcd"] == {"condition": "service_healthy"}
    for name, svc in services.items():
        if name not in one_shots:
            assert svc["healthcheck"]["test"], name
    # The same store-node count as `microco up`, each its own fault domain.
    nodes = [argv_of(s["command"]) for n, s in ours.items() if n.startswith("store-node-")]
    assert len(nodes) == StackOptions.__dataclass_fields__["store_nodes"].default
    assert len({a[a.index("--fault-domain") + 1] for a in nodes}) == len(nodes)
    # Published on the host, so never on the development token.
    console = services["console"]
    assert console["environment"]["MICROCO_PROFILE"] == "prod"
    assert console["environment"]["MICROCO_CONSOLE_TOKEN"].startswith("${MICROCO_CONSOLE_TOKEN:?")
    # The agent's jobs see the cache's chunk files at the path the cache serves them from.
    cache_dir = ours["cache"]["command"][ours["cache"]["command"].index("--data-dir") + 1]
    assert any(v.startswith("cache-data:") for v in ours["cache"]["volumes"])
    assert f"cache-data:{cache_dir}:ro" in ours["agent"]["volumes"]


def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_etcd_gets_the_roles_of_every_identity_the_pki_issues() -> None:
    """Compose and Kubernetes set up etcd's roles like `microco up`: a user for each service and
    administrator the pki job issues credentials to (docs/security.md), as service:stack from
    the CA; the services are told (MICROCO_ETCD_ROLES) so the scheduler adds its jobs' users."""
    services, docs = compose()["services"], k8s_docs()
    pods = [d["spec"]["template"]["spec"] for d in docs if "template" in d.get("spec", {})]
    inits = [c for p in pods for c in p.get("initContainers", []) if c["command"][3:4] == ["etcd-roles"]]
    assert len(inits) == 1  # the scheduler's init container
    pki = services["pki"]["command"]
    for cmd in (services["etcd-roles"]["command"], inits[0]["command"]):
        assert cmd[:4] == ["python", "-m", "microco.services.stack", "etcd-roles"], cmd
        assert sorted(_flag_values(cmd, "--service")) == sorted(_flag_values(pki, "--service"))
        assert _flag_values(cmd, "--admin") == _flag_values(pki, "--admin")
    roles = services["etcd-roles"]
    assert "pki-ca:/pki/ca:ro" in roles["volumes"] and "--etcd" in roles["command"]
    [env] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "microco-env"]
    assert env["data"]["MICROCO_ETCD_ROLES"] == "1"
    [pod] = [p for p in pods if inits[0] in p.get("initContainers", [])]
    assert pod["containers"][0]["name"] == "scheduler"
    init = inits[0]
    ca_dir = init["command"][init["command"].index("--ca-dir") + 1]
    [mount] = [m for m in init["volumeMounts"] if m["mountPath"] == ca_dir]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"]}
    assert secrets[mount["name"]] == "microco-ca"


def _etcd_as(endpoint: str, ident: Any) -> Any:
    import pyetcd

    from microco.common.identity import SERVICE_NAME, channel_credentials

    host, port = endpoint.rsplit(":", 1)
    ep = pyetcd.Endpoint(
        host,
        int(port),
        secure=True,
        creds=channel_credentials(ident),
        opts=[("grpc.ssl_target_name_override", SERVICE_NAME)],
    )
    return pyetcd.MultiEndpointEtcd3Client(endpoints=[ep], timeout=5)


def _pki(tmp: Path) -> Path:
    from microco.services.stack.__main__ import make_pki

    assert make_pki(tmp / "pki", ["etcd", "scheduler", "cache"], [], tmp / "pki" / "containers") == 0
    return tmp / "pki"


def test_compose_etcd_command_and_healthcheck_work_with_mutual_tls(tmp_path: Path) -> None:
    """The official image's etcd command and its healthcheck (etcdctl), run with the same etcd
    release's binaries on the files the pki job writes: healthy with the certificate, refused
    without one."""
    from microco.services.stack import free_port
    from microco.services.stack._servers import etcd_binary

    pki = _pki(tmp_path)
    ports = {":2379": f":{free_port()}", ":2380": f":{free_port()}", ":2381": f":{free_port()}"}

    def local(a: str) -> str:
        a = a.replace("/pki/", f"{pki}/containers/etcd/").replace("/etcd-data", str(tmp_path / "etcd-data"))
        # in one pass: a port put in for one may begin with another (":23805" holds ":2380")
        a = re.sub(r":23(79|80|81)\b", lambda m: ports[m.group(0)], a)
        return a.replace("0.0.0.0", "127.0.0.1").replace("//etcd:", "//localhost:")

    svc = compose()["services"]["etcd"]
    etcdctl = str(Path(etcd_binary()).with_name("etcdctl"))
    health = [etcdctl, *(local(a) for a in svc["healthcheck"]["test"][2:])]
    proc = subprocess.Popen(
        [etcd_binary(), *(local(a) for a in svc["command"][1:])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        ok = False
        for _ in range(150):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            if subprocess.run(health, capture_output=True, timeout=30, check=False).returncode == 0:
                ok = True
                break
            time.sleep(0.2)
        assert ok, "etcd never became healthy"
        no_cert = [a for a in health if not a.startswith(("--cert=", "--key="))] + ["--command-timeout=3s"]
        refused = subprocess.run(no_cert, capture_output=True, text=True, timeout=60, check=False)
        assert refused.returncode != 0, refused.stdout
        # the etcd-roles job's command on it: etcd's authentication on, the healthcheck still healthy
        from microco.common.identity import CertificateAuthority
        from microco.services.stack.__main__ import main

        roles = compose()["services"]["etcd-roles"]["command"][3:]
        roles[roles.index("--etcd") + 1] = f"127.0.0.1{ports[':2379']}"
        ca = tmp_path / "ca-only"  # the roles job sees the CA alone (the pki-ca volume)
        shutil.copytree(pki / "ca", ca / "ca")
        roles[roles.index("--data-dir") + 1] = str(ca)
        assert main(roles) == 0
        assert main(roles) == 0  # a second run (a restarted stack) changes nothing
        assert subprocess.run(health, capture_output=True, timeout=30, check=False).returncode == 0
        ep = f"127.0.0.1{ports[':2379']}"
        issue = CertificateAuthority.load(pki / "ca").issue
        _etcd_as(ep, issue("service:cache")).put("/microco/cache/x", b"1")
        _etcd_as(ep, issue("user:admin", admin=True)).put("/microco/store/catalog/t", b"{}")
        for who, key in (("service:cache", "/microco/store/catalog/t"), ("user:nobody", "/microco/cache/x")):
            with pytest.raises(Exception, match="(?i)permission denied|not found"):
                _etcd_as(ep, issue(who)).get(key)
    finally:
        proc.kill()
        proc.wait()


def _redis_config(command: list[str], pki: Path, tmp: Path) -> tuple[dict[str, str], Path]:
    """The config file the compose/Kubernetes Redis command writes (run with `cat` in place of
    redis-server), parsed, and where it was written; /pki/ is that container's own directory."""
    script = command[2].replace("$$", "$").replace("/pki/", f"{pki}/containers/redis/")
    conf = tmp / "redis.conf"
    script = script.replace("/tmp/redis.conf", str(conf)).replace("exec redis-server", "exec cat")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if line.strip()), conf


def test_compose_and_k8s_redis_serve_tls_only_with_client_certificates(tmp_path: Path) -> None:
    """The official image's Redis config (compose and Kubernetes alike): no plaintext port, TLS
    on 6379 with the files the pki job writes for Redis's container, client certificates
    required, the password required, written owner-only. The bundled redis-server has no TLS,
    so the same certificate, key and CA are then served by the stack's TLS front in front of it,
    with the config's password: no client certificate is refused, the platform's works."""
    import redis
    from cryptography import x509

    from microco.common.identity import Identity
    from microco.services.stack import free_port
    from microco.services.stack._servers import redis_binary

    pki = _pki(tmp_path)
    [k8s_redis] = [c for c in k8s_containers() if c["name"] == "redis"]
    compose_redis = compose()["services"]["redis"]
    assert k8s_redis["image"] == compose_redis["image"]
    configs = [_redis_config(compose_redis["command"], pki, tmp_path)]
    configs.append(_redis_config(k8s_redis["command"], pki, tmp_path))
    assert configs[0][0] == configs[1][0]
    conf, path = configs[0]
    password = (pki / "containers" / "redis" / "redis.password").read_text().strip()
    assert conf["port"] == "0" and conf["tls-port"] == "6379" and conf["tls-auth-clients"] == "yes"
    assert conf["requirepass"] == password and conf["protected-mode"] == "yes"
    assert path.stat().st_mode & 0o077 == 0  # the password's file stays private
    cert = x509.load_pem_x509_certificate(Path(conf["tls-cert-file"]).read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"redis", "redis.microco.svc"} <= set(names.get_values_for_type(x509.DNSName))
    for probe in (compose_redis["healthcheck"]["test"][1], k8s_redis["readinessProbe"]["exec"]["command"][2]):
        assert "--tls --cert /pki/cert.pem --key /pki/key.pem --cacert /pki/ca.pem" in probe
    # the same files served: the stack's TLS front before the bundled server, with that password
    port, sock = free_port(), tmp_path / "s" / "redis.sock"
    sock.parent.mkdir(mode=0o700)
    auth = tmp_path / "auth.conf"
    auth.write_text(f"requirepass {password}\n")
    front = Path(__file__).resolve().parents[3] / "services" / "stack" / "_redis_tls.py"
    proc = subprocess.Popen(
        [sys.executable, str(front), "--listen", f"127.0.0.1:{port}", "--unix", str(sock),
         "--cert", conf["tls-cert-file"], "--key", conf["tls-key-file"], "--ca", conf["tls-ca-cert-file"],
         "--", redis_binary(), str(auth), "--port", "0", "--unixsocket", str(sock), "--save", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        cache = pki / "containers" / "cache" / "credentials.pem"
        ident = Identity.from_pem(cache.read_bytes())
        tls = {"ssl_certfile": str(cache), "ssl_ca_data": ident.ca_pem.decode(), "ssl_check_hostname": True}
        good = redis.Redis.from_url(
            f"rediss://127.0.0.1:{port}/0", password=password, socket_timeout=5, **tls
        )
        for _ in range(200):
            try:
                assert good.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None
                time.sleep(0.05)
        assert good.ping()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        once = {"password": password, "socket_timeout": 5, "retry": Retry(NoBackoff(), 0)}
        with pytest.raises(redis.ConnectionError):  # no client certificate
            redis.Redis.from_url(f"rediss://127.0.0.1:{port}/0", ssl_cert_reqs="none", **once).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(f"rediss://127.0.0.1:{port}/0", socket_timeout=5, **tls).get("x")
    finally:
        proc.terminate()
        proc.wait(15)


# Which identity each container is: compose service or Kubernetes workload -> its service name.
_K8S_IDENTITY = {"store-coordinator": "store"}


def _own(name: str) -> str:
    return "store-node" if name.startswith("store-node") else _K8S_IDENTITY.get(name, name)


def _identities_in(directory: Path) -> tuple[set[str], bool]:
    """The identities whose private keys a directory of credentials holds (by the certificate
    each key belongs to), and whether it holds Redis's password."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from microco.common.identity import _pem_blocks, peer_name

    certs, keys = {}, []
    for f in directory.iterdir():
        if f.suffix == ".pem":
            for kind, block in _pem_blocks(f.read_bytes()):
                if kind == "CERTIFICATE":
                    cert = x509.load_pem_x509_certificate(block)
                    certs[
                        cert.public_key().public_bytes(
                            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
                        )
                    ] = block
                elif kind.endswith("PRIVATE KEY"):
                    keys.append(block)
    names = set()
    for key_pem in keys:
        pub = (
            serialization.load_pem_private_key(key_pem, None)
            .public_key()
            .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        name, admin = peer_name(certs[pub])
        names.add(name + (" (admin)" if admin else ""))
    return names, (directory / "redis.password").exists()


def test_each_container_holds_only_its_own_credentials(tmp_path: Path) -> None:
    """No container mounts another service's key or an administrator's: compose gives each its
    own volume pki-<service> (the pki job writes only that service's files there), Kubernetes
    each pod its own Secret microco-pki-<service>; only the scheduler (and etcd's roles job)
    mounts the CA, and Redis's password goes only where Redis is used."""
    from microco.services.stack.__main__ import REDIS_CLIENTS, SERVER_HOSTS

    services = compose()["services"]
    pki_cmd = services["pki"]["command"]
    issued = [*_flag_values(pki_cmd, "--service"), "redis"]
    out = tmp_path / "pki"
    from microco.services.stack.__main__ import make_pki

    assert make_pki(out, _flag_values(pki_cmd, "--service"), _flag_values(pki_cmd, "--admin"), out / "c") == 0
    for name in issued:  # what the pki job writes for each container: its own key, nothing else
        keys, password = _identities_in(out / "c" / name)
        assert keys == {f"service:{name}"}, (name, keys)
        assert password == (name in REDIS_CLIENTS or name == "redis"), name
    per_container = _flag_values(pki_cmd, "--per-container")[0]
    job_mounts = {v.split(":")[0]: v.split(":")[1] for v in services["pki"]["volumes"]}
    for name, svc in services.items():
        if name == "pki":
            continue
        pki_volumes = {v.split(":")[0]: v for v in svc.get("volumes", []) if v.startswith("pki")}
        ca = {"pki-ca"} if name in ("scheduler", "etcd-roles") else set()
        if name == "etcd-roles":
            assert set(pki_volumes) == ca, name
            continue
        own = f"pki-{_own(name)}"
        assert set(pki_volumes) == {own} | ca, (name, pki_volumes)
        assert job_mounts[own] == f"{per_container}/{_own(name)}", name  # the pki job fills it
        assert pki_volumes[own].split(":")[1:] == ["/pki", "ro"], name
    env = services["scheduler"]["environment"]
    assert env["MICROCO_CA_DIR"] == "/pki-ca" and services["cache"]["environment"][
        "MICROCO_REDIS"
    ].startswith("rediss://")
    # Kubernetes: each pod mounts its own Secret (and the scheduler the CA's), nothing else.
    for doc in _workloads():
        name = doc["metadata"]["name"]
        pod = doc["spec"]["template"]["spec"]
        secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        expected = {f"microco-pki-{_own(name)}"} | ({"microco-ca"} if name == "scheduler" else set())
        assert secrets == expected, (name, secrets)
        for c in pod["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if c["image"] == IMAGE:
                assert env["MICROCO_CREDENTIALS"] == "/pki/credentials.pem", name
    assert set(SERVER_HOSTS) == {"etcd", "redis"}


def test_dockerfile_copies_what_exists() -> None:
    for line in (REPO / "deploy/docker/Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), src


def test_k8s_manifests_validate_against_the_api_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version()
    for doc in k8s_docs():
        kubernetes_validate.validate(doc, version, strict=True)  # raises, naming the field


def _workloads() -> list[dict]:
    return [d for d in k8s_docs() if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]


def test_k8s_manifests_carry_what_a_cluster_needs() -> None:
    docs = k8s_docs()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("DaemonSet", "agent") in kinds and ("DaemonSet", "cache") in kinds
    assert ("StatefulSet", "etcd") in kinds and ("StatefulSet", "store-node") in kinds
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    redis_image = compose()["services"]["redis"]["image"]
    for doc in _workloads():
        name = doc["metadata"]["name"]
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
        if doc["kind"] == "StatefulSet":  # its governing Service exists and is headless
            assert services[doc["spec"]["serviceName"]]["spec"]["clusterIP"] == "None", name
        for c in doc["spec"]["template"]["spec"]["containers"]:
            assert c["image"] == (redis_image if name == "redis" else IMAGE)
            assert c["readinessProbe"] and c["livenessProbe"], name
            res = c["resources"]
            assert {"cpu", "memory"} <= set(res["requests"]), name
            if name == "agent":  # its jobs run in its container: GPUs, no CPU/memory cap
                assert "nvidia.com/gpu" in res["limits"]
            else:
                assert {"cpu", "memory"} <= set(res["limits"]), name
    # Only the platform's own pods reach its ports; others the console's HTTP and metrics alone.
    [internal] = [d for d in docs if d["kind"] == "NetworkPolicy" and d["spec"]["podSelector"] == {}]
    assert internal["spec"]["policyTypes"] == ["Ingress"]
    for rule in internal["spec"]["ingress"]:
        assert rule["from"] == [{"podSelector": {}}] or [p["port"] for p in rule["ports"]] == [9090], rule
    opened = [d for d in docs if d["kind"] == "NetworkPolicy" and d is not internal]
    assert [d["spec"]["podSelector"] for d in opened] == [{"matchLabels": {"app": "console"}}]
    coordinator = next(d for d in _workloads() if d["metadata"]["name"] == "store-coordinator")
    # The coordinators elect a leader (services/store/_standby.py): two give a hot standby.
    assert coordinator["spec"]["replicas"] == 2
    # Agents and caches on GPU hosts (tainted ones too), sharing the cache's chunk directory.
    ds = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] == "DaemonSet"}
    for name in ("agent", "cache"):
        assert ds[name]["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in ds[name]["tolerations"])
    host = {v["name"]: v["hostPath"]["path"] for v in ds["cache"]["volumes"] if "hostPath" in v}
    cache_c = ds["cache"]["containers"][0]
    data_dir = cache_c["command"][cache_c["command"].index("--data-dir") + 1]
    [mount] = [m for m in cache_c["volumeMounts"] if m["mountPath"] == data_dir]
    agent_mounts = {m["mountPath"]: m for m in ds["agent"]["containers"][0]["volumeMounts"]}
    agent_host = {v["name"]: v["hostPath"]["path"] for v in ds["agent"]["volumes"] if "hostPath" in v}
    shared = agent_mounts[data_dir]
    assert shared["readOnly"] and agent_host[shared["name"]] == host[mount["name"]]
    # Store nodes take their fault domain from the zone label.
    store = next(d for d in _workloads() if d["metadata"]["name"] == "store-node")
    env = {e["name"]: e for e in store["spec"]["template"]["spec"]["containers"][0]["env"]}
    zone = env["MICROCO_ZONE"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert zone == "metadata.labels['topology.kubernetes.io/zone']"
    assert "$MICROCO_ZONE" in store["spec"]["template"]["spec"]["containers"][0]["command"][2].replace(
        "{", ""
    )


def test_every_command_is_a_microco_module() -> None:
    for argv in all_commands():
        assert argv[:2] == ["python", "-m"], argv
        assert argv[2].startswith("microco."), argv


def _run(argv: list[str], tmp: Path) -> tuple[list[str], int, str]:
    # Real parse of the real flags: with etcd unreachable a service that accepted its arguments
    # stops with the clear "cannot reach etcd" error instead of "unrecognized arguments".
    cmd = [sys.executable, *argv[1:], "--data-dir", str(tmp), "--etcd", "127.0.0.1:9"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    return argv, proc.returncode, proc.stderr


@pytest.mark.slow
def test_every_service_command_accepts_its_arguments(tmp_path: Path) -> None:
    # One command per entry point and set of flags (the six store nodes differ only in values).
    by_shape = {(*a[:4], *sorted(x for x in a if x.startswith("--"))): tuple(a) for a in all_commands()}
    commands = {a for a in by_shape.values() if a[2] != "microco.services.stack"}
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda a: _run(list(a), tmp_path), sorted(commands)))
    for argv, code, err in results:
        assert "unrecognized arguments" not in err and "invalid choice" not in err, (argv, err[-500:])
        assert code != 0 and "cannot reach etcd" in err, (argv, err[-800:])


def test_bundled_server_commands_parse() -> None:
    for argv in all_commands():
        if argv[2] == "microco.services.stack":
            from microco.services.stack.__main__ import main

            with pytest.raises(SystemExit) as info:
                main([*argv[3:], "--help"])
            assert info.value.code == 0
