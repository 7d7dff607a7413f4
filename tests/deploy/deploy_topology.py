"""deploy/ read as a topology for tests/deploy: every process (command, environment, config, port, probes) and the
names it is reached by, from compose (with overrides and profiles) and from the Kubernetes manifests."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from deploy_expand import compose_interpolate, container_argv, k8s_expand
from cli import main as cli
from parley.config import AppConfig, ConfigError

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCS = ROOT / "docs" / "deploy.md"
DOCKERFILE = DEPLOY / "Dockerfile"

# The host's environment when compose reads the file (and the public name a deployer would set). The secrets are
# digits only, as a generated token may be: a token that is not quoted as a YAML string in `--set server.token=...`
# would load as a number and fail the config.
HOST_ENV = {"PARLEY_TOKEN": "1111", "PARLEY_STAGES_KEY": "2222", "PARLEY_LLM_KEY": "3333", "HF_TOKEN": "4444",
            "PARLEY_PUBLIC_HOST": "parley.example.com", "PARLEY_DB_PASSWORD": "5555"}  # fmt: skip
NAMESPACE = "parley-ns"  # what a fieldRef to metadata.namespace gives
POD_IP = "10.1.2.3"  # the kubelet's Host for a probe without a Host header is the pod's address
VLLM_DEFAULT_PORT = 8000


# -- the processes and the names they are reached by ----------------------------------------------------------------


@dataclass
class Probe:
    where: str
    path: str
    port: int
    host: str  # the Host header it sends


@dataclass
class Proc:
    name: str
    kind: str  # parley | vllm | nginx | postgres
    argv: list[str]  # as the process gets it
    raw: str  # the command before any expansion (secrets must come from the environment)
    env: dict[str, str]
    container_ports: dict[str, int] = field(default_factory=dict)  # k8s: name -> containerPort
    probes: list[Probe] = field(default_factory=list)
    replicas: int = 1
    resources: dict[str, Any] = field(default_factory=dict)
    cfg: AppConfig | None = None
    command: str = ""  # parley: serve | stages
    listen: int = 0

    def load(self) -> None:
        if self.kind == "parley":
            assert self.argv[0] == "parley", f"{self.name}: runs {self.argv[0]!r}, not parley"
            parser = cli._parser()
            args, unknown = parser.parse_known_args(self.argv[1:])
            assert not unknown, f"{self.name}: parley does not know {unknown}"
            assert args.command in ("serve", "stages"), f"{self.name}: `parley {args.command}` is no server"
            try:
                self.cfg = cli._load(args)  # exactly what `parley` does with the flags
            except ConfigError as exc:
                pytest.fail(f"{self.name}: config error: {exc}")
            self.command, self.listen = args.command, self.cfg.server.port
        elif self.kind == "vllm":
            assert self.argv[:2] == ["vllm", "serve"], f"{self.name}: {self.argv[:2]}"
            self.listen = int(vllm_flag(self.argv, "--port") or VLLM_DEFAULT_PORT)
        elif self.kind == "postgres":
            self.listen = int(self.env.get("PGPORT", 5432))


VLLM_BOOL_FLAGS = {"--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-prompt-tokens-details",
                   "--trust-remote-code", "--enforce-eager", "--enable-auto-tool-choice"}  # fmt: skip


def vllm_args(argv: list[str]) -> tuple[list[str], dict[str, str | None]]:
    positional, flags = [], {}
    rest = argv[2:]
    i = 0
    while i < len(rest):
        a = rest[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                flags[k] = v
            elif a in VLLM_BOOL_FLAGS or i + 1 == len(rest) or rest[i + 1].startswith("--"):
                flags[a] = None
            else:
                flags[a] = rest[i + 1]
                i += 1
        else:
            positional.append(a)
        i += 1
    return positional, flags


def vllm_flag(argv: list[str], name: str) -> str | None:
    return vllm_args(argv)[1].get(name)


def vllm_served_names(proc: Proc) -> set[str]:
    positional, flags = vllm_args(proc.argv)
    model = flags.get("--model") or (positional[0] if positional else None)
    served = flags.get("--served-model-name")
    return {served} if served else {model} if model else set()


@dataclass
class Route:
    """How a client reaches a process: by this host name on these ports (service port -> container port)."""

    proc: str
    ports: dict[int, int] | None  # None: any port, as is (compose's network)


@dataclass
class Public:
    """A browser's way in, through the front door: the Host the front end gets, the page's Origin."""

    where: str
    proc: str
    port: int  # the container port it reaches
    host: str
    origin: str
    read_timeout_s: float


@dataclass
class Topology:
    name: str
    procs: dict[str, Proc]
    dns: dict[str, Route]
    public: list[Public]
    raw: dict[str, Any] = field(default_factory=dict)

    def parley(self, command: str | None = None) -> list[Proc]:
        return [p for p in self.procs.values() if p.kind == "parley" and command in (None, p.command)]

    def reach(self, host: str, port: int) -> tuple[Proc, int]:
        assert host in self.dns, f"{self.name}: no service named {host!r} (known: {sorted(self.dns)})"
        route = self.dns[host]
        if route.ports is None:
            return self.procs[route.proc], port
        assert port in route.ports, f"{self.name}: service {host!r} has no port {port} (ports: {sorted(route.ports)})"
        return self.procs[route.proc], route.ports[port]


def dockerfile_cmd() -> list[str]:
    m = re.search(r"^CMD\s+(\[.*\])\s*$", DOCKERFILE.read_text(), re.M)
    assert m, "deploy/Dockerfile has no CMD [...]"
    return json.loads(m.group(1))


def _kind(image: str, build: bool) -> str:
    if build or image.startswith("parley"):
        return "parley"
    for kind in ("vllm", "nginx", "postgres"):
        if image.split("/")[-1].startswith(kind) or image.startswith(f"{kind}/"):
            return kind
    raise AssertionError(f"unknown image {image!r}")


def _argv(kind: str, command: list[str] | None, env: dict[str, str]) -> list[str]:
    if kind == "vllm":  # the image's entrypoint is `vllm serve`; the command is its arguments
        return ["vllm", "serve", *(command or [])]
    if kind in ("nginx", "postgres"):
        return [kind]
    return container_argv(command or dockerfile_cmd(), env)


# -- compose ---------------------------------------------------------------------------------------------------------


def merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
    return over


def _env_map(env: Any) -> dict[str, str]:
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in (env or {}).items()}


def _healthcheck_probe(name: str, test: Any) -> Probe:
    text = test if isinstance(test, str) else " ".join(test)
    m = re.search(r"https?://[^'\"\s)]+", text)
    assert m, f"{name}: healthcheck without a URL: {text!r}"
    u = urlsplit(m.group(0))
    return Probe(f"{name} healthcheck", u.path or "/", u.port or 80, u.netloc)


def compose_files(extra: tuple[str, ...]) -> list[Path]:
    return [DEPLOY / "compose.yaml", *(DEPLOY / f for f in extra)]


def load_compose(extra: tuple[str, ...] = (), profiles: frozenset[str] = frozenset()) -> Topology:
    raw: dict[str, Any] = {}
    for path in compose_files(extra):
        doc = yaml.safe_load(path.read_text())
        # compose fills in `$` on the host: a command must escape its own (`$$`) for the container's shell
        for sname, svc in doc.get("services", {}).items():
            for s in _strings(svc.get("command")):
                assert "$" not in s.replace("$$", ""), (
                    f"{path.name}: {sname}: command has an unescaped `$` (compose fills it in on the host): {s!r}")
        raw = merge(raw, doc)
    data = compose_interpolate(raw, HOST_ENV)
    services = {n: s for n, s in data["services"].items() if not s.get("profiles") or set(s["profiles"]) & profiles}
    procs: dict[str, Proc] = {}
    public: list[Public] = []
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"compose: {name} depends on {dep!r}, which is not running with profiles {set(profiles)}"
        env = _env_map(svc.get("environment"))
        kind = _kind(svc.get("image", ""), "build" in svc)
        command = svc.get("command")
        if isinstance(command, str):
            command = ["sh", "-c", command] if kind == "parley" else command.split()
        raw_cmd = " ".join(_strings(raw["services"][name].get("command")))
        proc = Proc(name, kind, _argv(kind, command, env), raw_cmd, env,
                    replicas=int(svc.get("deploy", {}).get("replicas", 1)),
                    resources=svc.get("deploy", {}).get("resources", {}))  # fmt: skip
        if "healthcheck" in svc and kind == "postgres":
            assert "pg_isready" in " ".join(_strings(svc["healthcheck"]["test"])), f"compose: {name}: probe with pg_isready"
        elif "healthcheck" in svc:
            proc.probes.append(_healthcheck_probe(name, svc["healthcheck"]["test"]))
        proc.load()
        if kind == "parley":
            exposed = {int(p) for p in svc.get("expose", [])}
            assert proc.listen in exposed, f"compose: {name} listens on {proc.listen}, exposes {sorted(exposed)}"
        procs[name] = proc
        if kind == "nginx":
            public += nginx_routes(name, svc)
    dns = {name: Route(name, None) for name in services}
    return Topology("compose" + "".join(f"+{f}" for f in extra), procs, dns, public, raw)


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def nginx_conf(svc: dict[str, Any]) -> str:
    for volume in svc.get("volumes", []):
        src, dst = volume.split(":")[:2]
        if dst.startswith("/etc/nginx/"):
            return (DEPLOY / src).read_text()
    raise AssertionError("the nginx service mounts no config from deploy/")


def nginx_routes(name: str, svc: dict[str, Any]) -> list[Public]:
    conf = re.sub(r"#.*", "", nginx_conf(svc))
    listen = int(re.search(r"\blisten\s+(\d+)", conf).group(1))  # type: ignore[union-attr]
    published = [p.split(":") for p in svc.get("ports", [])]
    assert published, f"compose: {name} publishes no port"
    upstreams = {m.group(1): re.findall(r"\bserver\s+([\w.-]+:\d+)", m.group(2))
                 for m in re.finditer(r"upstream\s+(\w+)\s*\{(.*?)\}", conf, re.S)}  # fmt: skip
    target = re.search(r"proxy_pass\s+http://([\w.:-]+)\s*;", conf).group(1)  # type: ignore[union-attr]
    servers = upstreams.get(target, [target])
    headers = dict(re.findall(r"proxy_set_header\s+(\S+)\s+(\S+?)\s*;", conf))
    assert "1.1" in re.findall(r"proxy_http_version\s+([\d.]+)", conf), "nginx: WebSockets need proxy_http_version 1.1"
    assert headers.get("Upgrade") == "$http_upgrade" and "Connection" in headers, "nginx: WebSocket upgrade headers"
    m = re.search(r"proxy_read_timeout\s+(\d+)s?\s*;", conf)
    read_timeout = float(m.group(1)) if m else 60.0  # nginx's default
    routes = []
    for host_port, container_port in ((int(p[-2]), int(p[-1])) for p in published):
        assert container_port == listen, f"compose: {name} publishes {container_port}, nginx listens on {listen}"
        # a browser on this machine, and one elsewhere using the public name the deployer sets
        for browser in ("localhost", HOST_ENV["PARLEY_PUBLIC_HOST"]):
            browser_host = f"{browser}:{host_port}"
            sent = {"$http_host": browser_host, "$host": browser}.get(headers.get("Host", ""))
            for server in servers:
                upstream_host, upstream_port = server.rsplit(":", 1)
                host = sent if sent is not None else server  # no Host header: nginx sends the upstream's name
                routes.append(Public(f"{name} -> {server} (browser at {browser_host})", upstream_host,
                                     int(upstream_port), host, f"http://{browser_host}", read_timeout))  # fmt: skip
    return routes


# -- Kubernetes ------------------------------------------------------------------------------------------------------


def k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc["_file"] = path.name
                docs.append(doc)
    return docs


def secret_value(name: str, key: str) -> str:
    return str(5000 + sum(ord(c) for c in f"{name}/{key}"))  # digits, one per secret key


def k8s_env(container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = k8s_expand(str(item["value"]), env)
        elif "secretKeyRef" in item.get("valueFrom", {}):
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secret_value(ref["name"], ref["key"])
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = NAMESPACE
        else:
            raise AssertionError(f"env {item['name']}: unsupported source {item.get('valueFrom')}")
    return env


def _port(value: Any, ports: dict[str, int], where: str) -> int:
    if isinstance(value, int):
        return value
    assert value in ports, f"{where}: no container port named {value!r} (named: {sorted(ports)})"
    return ports[value]


def load_k8s() -> Topology:
    docs = k8s_docs()
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "Ingress"} <= kinds, kinds
    procs: dict[str, Proc] = {}
    labels: dict[str, dict[str, str]] = {}
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        spec = d["spec"]
        pod = spec["template"]["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items(), d["metadata"]
        (container,) = pod["containers"]
        name = d["metadata"]["name"]
        env = k8s_env(container)
        kind = _kind(container["image"], False)
        argv = [k8s_expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]
        if kind == "vllm":
            argv = argv if argv[:2] == ["vllm", "serve"] else ["vllm", "serve", *argv]
        elif kind == "parley":
            argv = container_argv(argv or dockerfile_cmd(), env)
        ports = {p.get("name", str(p["containerPort"])): p["containerPort"] for p in container.get("ports", [])}
        proc = Proc(name, kind, argv, " ".join(container.get("command", []) + container.get("args", [])), env, ports,
                    replicas=spec.get("replicas", 1), resources=container.get("resources", {}))  # fmt: skip
        for which in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container.get(which, {}).get("httpGet")
            if get is None:
                continue
            port = _port(get["port"], ports, f"{name} {which}")
            host = next((h["value"] for h in get.get("httpHeaders", []) if h["name"].lower() == "host"), f"{POD_IP}:{port}")
            proc.probes.append(Probe(f"{name} {which}", get["path"], port, host))
        proc.load()
        procs[name] = proc
        labels[name] = spec["template"]["metadata"]["labels"]
    dns: dict[str, Route] = {}
    service_ports: dict[str, dict[Any, int]] = {}
    for d in docs:
        if d["kind"] != "Service":
            continue
        name, selector = d["metadata"]["name"], d["spec"]["selector"]
        matches = [p for p, lab in labels.items() if selector.items() <= lab.items()]
        assert len(matches) == 1, f"Service {name}: its selector {selector} matches {matches}"
        proc = procs[matches[0]]
        ports = {p["port"]: _port(p.get("targetPort", p["port"]), proc.container_ports, f"Service {name}")
                 for p in d["spec"]["ports"]}  # fmt: skip
        service_ports[name] = {**ports, **{p["name"]: p["port"] for p in d["spec"]["ports"] if "name" in p}}
        for host in (name, f"{name}.{NAMESPACE}", f"{name}.{NAMESPACE}.svc", f"{name}.{NAMESPACE}.svc.cluster.local"):
            dns[host] = Route(proc.name, ports)
    public = []
    for d in docs:
        if d["kind"] != "Ingress":
            continue
        notes = d["metadata"].get("annotations", {})
        timeout = float(notes.get("nginx.ingress.kubernetes.io/proxy-read-timeout", 60))
        for rule in d["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                svc = path["backend"]["service"]
                assert svc["name"] in service_ports, f"Ingress {d['metadata']['name']}: no Service {svc['name']!r}"
                port = svc["port"].get("number") or service_ports[svc["name"]].get(svc["port"].get("name"))
                assert port, f"Ingress: Service {svc['name']} has no port {svc['port']}"
                proc, container_port = Topology("k8s", procs, dns, []).reach(svc["name"], int(port))
                public.append(Public(f"Ingress {rule['host']}", proc.name, container_port, rule["host"],
                                     f"https://{rule['host']}", timeout))  # fmt: skip
    return Topology("k8s", procs, dns, public, {"docs": docs})


TOPOLOGIES: dict[str, Callable[[], Topology]] = {
    "compose": lambda: load_compose(),
    "compose+gpu": lambda: load_compose(("compose.gpu.yaml",), frozenset({"gpu"})),
    "k8s": load_k8s,
}
