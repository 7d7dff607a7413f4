"""deploy/ (compose, Kubernetes, nginx, Dockerfile) and docs/deploy.md checked against the code, without Docker or a
network: each container's command is expanded as compose, Kubernetes and its shell would (secrets replaced by
dummy values), parsed by `parley`'s own argument parser and loaded into the real config; every remote stage's
base_url must name a service that exists and reaches a process listening on that port, which accepts the Host and
the key the front end sends (asked of the real app, in process); every probe must reach a real route through the
Host allow-list; the front door must send a Host the front ends allow.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from fastapi.testclient import TestClient

from parley import cli
from web.app import create_app
from parley.config import DEFAULT_CONFIG, AppConfig, ConfigError, load_config
from web.limits import origin_allowed
from web.openai_api.app import KIND, create_stages_app, voice_aliases

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCS = ROOT / "docs" / "deploy.md"
DOCKERFILE = DEPLOY / "Dockerfile"

# The host's environment when compose reads the file (and the public name a deployer would set). The secrets are
# digits only, as a generated token may be: a token that is not quoted as a YAML string in `--set server.token=...`
# would load as a number and fail the config.
HOST_ENV = {"PARLEY_TOKEN": "1111", "PARLEY_STAGES_KEY": "2222", "PARLEY_LLM_KEY": "3333", "HF_TOKEN": "4444",
            "PARLEY_PUBLIC_HOST": "parley.example.com"}  # fmt: skip
NAMESPACE = "parley-ns"  # what a fieldRef to metadata.namespace gives
POD_IP = "10.1.2.3"  # the kubelet's Host for a probe without a Host header is the pod's address
VLLM_DEFAULT_PORT = 8000


class ExpansionError(ValueError):
    pass


# -- expansion: compose, Kubernetes, sh ---------------------------------------------------------------------------

_COMPOSE_VAR = re.compile(r"\$\$|\$\{(\w+)(?:(:?)([-?])([^}]*))?\}|\$(\w+)")
_SH_VAR = re.compile(r"\$\{(\w+)(?:(:?)([-?=+])([^}]*))?\}|\$(\w+)")


def compose_interpolate(value: Any, host_env: dict[str, str]) -> Any:
    """What compose does to every string of the file: `$$` is a `$`, `${X:-d}` a default, `${X:?}` required."""
    if isinstance(value, dict):
        return {k: compose_interpolate(v, host_env) for k, v in value.items()}
    if isinstance(value, list):
        return [compose_interpolate(v, host_env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(5)
        colon, op, arg = m.group(2), m.group(3), m.group(4)
        val = host_env.get(name)
        missing = val is None or (colon == ":" and val == "")
        if op == "-":
            return arg if missing else val  # type: ignore[return-value]
        if op == "?":
            if missing:
                raise ExpansionError(f"compose: {name} is required ({arg}) and the test's host has no value for it")
            return val  # type: ignore[return-value]
        return val or ""

    return _COMPOSE_VAR.sub(one, value)


def k8s_expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' own expansion in command/args: `$(VAR)` from the container's env, `$$` a `$`."""
    return re.sub(r"\$\$|\$\((\w+)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def _sh_expand(m: re.Match[str], env: dict[str, str]) -> str:
    name = m.group(1) or m.group(5)
    colon, op, arg = m.group(2), m.group(3), m.group(4)
    val = env.get(name)
    missing = val is None or (colon == ":" and val == "")
    if op in ("-", "="):
        return arg if missing else val  # type: ignore[return-value]
    if op == "+":
        return "" if missing else arg
    if missing:
        # `${X:?}` stops the shell (the intent), a bare `$X` would be empty: either way the container lacks X
        raise ExpansionError(f"sh: ${name} is used but the container's environment does not set it")
    return val  # type: ignore[return-value]


def sh_words(script: str, env: dict[str, str]) -> list[str]:
    """A POSIX shell's words for a simple command line: quotes, backslashes and parameter expansion (not inside
    single quotes). Anything more (pipes, `;`, substitutions) is refused: the containers run one `exec`."""
    words: list[str] = []
    cur: list[str] = []
    have = False
    quote: str | None = None
    i = 0
    while i < len(script):
        c = script[i]
        if quote == "'":
            if c == "'":
                quote = None
            else:
                cur.append(c)
            i += 1
            continue
        if c == "\\" and i + 1 < len(script):
            nxt = script[i + 1]
            if quote == '"' and nxt not in '$`"\\\n':
                cur.append(c)
            cur.append(nxt)
            i, have = i + 2, True
            continue
        if c == "$":
            m = _SH_VAR.match(script, i)
            if m is None:
                raise ExpansionError(f"sh: unsupported `$` syntax at {script[i:i + 20]!r}")
            cur.append(_sh_expand(m, env))
            i, have = m.end(), True
            continue
        if quote == '"':
            if c == '"':
                quote = None
            else:
                cur.append(c)
            i += 1
            continue
        if c in "'\"":
            quote, have = c, True
        elif c.isspace():
            if cur or have:
                words.append("".join(cur))
            cur, have = [], False
        elif c in ";&|<>`()":
            raise ExpansionError(f"sh: unsupported syntax {c!r} in {script!r}")
        else:
            cur.append(c)
        i += 1
    if quote:
        raise ExpansionError(f"sh: unclosed {quote} in {script!r}")
    if cur or have:
        words.append("".join(cur))
    return words


def container_argv(argv: list[str], env: dict[str, str]) -> list[str]:
    """The process a container runs: through `sh -c` (with `exec`) when it uses one."""
    if argv[:2] in (["sh", "-c"], ["/bin/sh", "-c"]):
        words = sh_words(argv[2], env)
        assert words and words[0] == "exec", f"`sh -c` without `exec`: the shell, not Parley, gets SIGTERM: {argv[2]!r}"
        return words[1:]
    return list(argv)


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
    kind: str  # parley | vllm | nginx
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


VLLM_BOOL_FLAGS = {"--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-prompt-tokens-details",
                   "--trust-remote-code", "--enforce-eager"}  # fmt: skip


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
    for kind in ("vllm", "nginx"):
        if image.split("/")[-1].startswith(kind) or image.startswith(f"{kind}/"):
            return kind
    raise AssertionError(f"unknown image {image!r}")


def _argv(kind: str, command: list[str] | None, env: dict[str, str]) -> list[str]:
    if kind == "vllm":  # the image's entrypoint is `vllm serve`; the command is its arguments
        return ["vllm", "serve", *(command or [])]
    if kind == "nginx":
        return ["nginx"]
    return container_argv(command or dockerfile_cmd(), env)


# -- compose ---------------------------------------------------------------------------------------------------------


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in over.items()}}
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
        raw = _merge(raw, doc)
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
        if "healthcheck" in svc:
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


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def topo(request: pytest.FixtureRequest) -> Topology:
    return TOPOLOGIES[request.param]()


def app_for(proc: Proc) -> TestClient:
    """The process's real app, routes and Guard included; its models are not loaded (no lifespan here)."""
    assert proc.cfg is not None
    app = create_app(proc.cfg) if proc.command == "serve" else create_stages_app(proc.cfg)
    return TestClient(app, base_url=f"http://127.0.0.1:{proc.listen}")


# -- the checks ------------------------------------------------------------------------------------------------------


def test_every_topology_has_a_stage_server_per_stage_and_replicated_front_ends(topo: Topology) -> None:
    fronts, stages = topo.parley("serve"), topo.parley("stages")
    assert stages and fronts, topo.procs
    served = [s for p in stages if p.cfg is not None for s in p.cfg.server.stages]
    assert all(p.cfg is not None and len(p.cfg.server.stages) == 1 for p in stages), "one stage server per stage"
    assert sorted(served) == sorted(set(served)), f"{topo.name}: a stage served twice: {served}"
    assert sum(p.replicas for p in fronts) >= 2, "the front ends are meant to be replicated"
    assert topo.public, f"{topo.name}: no front door"
    for p in topo.parley():
        assert p.cfg is not None and p.cfg.server.host == "0.0.0.0", f"{p.name}: must listen on all addresses in a container"
        assert p.resources.get("limits"), f"{p.name}: no resource limits"


def test_parley_processes_load_with_the_expected_backends(topo: Topology) -> None:
    for p in topo.parley("serve"):
        cfg = p.cfg
        assert cfg is not None
        assert cfg.models.asr.backend == "openai" and cfg.models.llm.backend == "openai", p.name
        local = [n for n, v in cfg.voices.items() if v.backend != "openai"]
        assert not local, f"{p.name}: voices still local: {local}"
    for p in topo.parley("stages"):
        cfg = p.cfg
        assert cfg is not None
        served = cfg.server.stages
        assert "asr" not in served or cfg.models.asr.backend == "local", p.name
        assert "llm" not in served or cfg.models.llm.backend == "local", p.name
        assert "tts" not in served or all(v.backend != "openai" for v in cfg.voices.values()), p.name


def test_tokens_are_set_and_come_from_the_environment(topo: Topology) -> None:
    for p in topo.parley():
        assert p.cfg is not None and p.cfg.server.token, f"{p.name}: no server.token (anyone could connect)"
        assert p.cfg.server.token in p.env.values(), f"{p.name}: the token is not one of the container's env values"
        m = re.search(r"server\.token=(\S+)", p.raw)
        assert m and "$" in m.group(1), f"{p.name}: server.token must come from an environment variable: {p.raw!r}"


def test_probes_reach_a_real_route_through_the_host_allow_list(topo: Topology) -> None:
    for p in topo.procs.values():
        if p.kind == "nginx":
            continue
        assert p.probes, f"{p.name}: no health check"
        for probe in p.probes:
            assert probe.port == p.listen, f"{probe.where}: port {probe.port}, the process listens on {p.listen}"
            if p.kind == "vllm":
                assert probe.path == "/health", f"{probe.where}: vLLM's health route is /health, not {probe.path}"
                continue
            r = app_for(p).get(probe.path, headers={"host": probe.host})
            # 503: the route, while models load (none are loaded here); 421 would be a Host the app refuses
            assert r.status_code in (200, 503), f"{probe.where}: GET {probe.path}, Host {probe.host}: {r.status_code} {r.text}"


def test_kubernetes_ports_agree(topo: Topology) -> None:
    for p in topo.procs.values():
        if p.container_ports:
            ports = set(p.container_ports.values())
            assert ports == {p.listen}, f"{p.name}: containerPorts {p.container_ports}, listens on {p.listen}"


def _remotes(cfg: AppConfig) -> Iterator[tuple[str, Any, str | None]]:
    """(stage, remote, the voice's speaker) for every remote stage of a config."""
    m = cfg.models
    if m.asr.remote is not None and m.asr.backend == "openai":
        yield "asr", m.asr.remote, None
    if m.llm.remote is not None and m.llm.backend == "openai":
        yield "llm", m.llm.remote, None
    for name, v in cfg.voices.items():
        if v.backend == "openai":
            yield f"voice {name}", v.remote, v.speaker


def test_remote_stages_name_a_service_that_listens_and_accepts_the_front_end(topo: Topology) -> None:
    checked = 0
    for p in topo.parley():
        assert p.cfg is not None
        for stage, remote, speaker in _remotes(p.cfg):
            where = f"{topo.name}: {p.name}: {stage}"
            u = urlsplit(remote.base_url)
            port = u.port or (443 if u.scheme == "https" else 80)
            assert u.path.rstrip("/") == "/v1", f"{where}: base_url {remote.base_url} should end in /v1"
            target, container_port = topo.reach(u.hostname or "", port)
            assert container_port == target.listen, (
                f"{where}: {u.netloc} reaches port {container_port} of {target.name}, which listens on {target.listen}")
            assert remote.api_key_env and p.env.get(remote.api_key_env), (
                f"{where}: api_key_env {remote.api_key_env} is not in {p.name}'s env")
            key = p.env[remote.api_key_env]
            if target.kind == "vllm":
                assert stage == "llm", f"{where}: vLLM serves the LLM only"
                served = vllm_served_names(target)
                assert remote.model in served, f"{where}: model {remote.model!r}, vLLM serves {served}"
                vllm_key = vllm_flag(target.argv, "--api-key") or target.env.get("VLLM_API_KEY")
                assert key == vllm_key, f"{where}: not vLLM's key"
            else:
                assert target.kind == "parley" and target.command == "stages", f"{where}: {target.name} is not a stage server"
                assert target.cfg is not None
                need = "tts" if speaker is not None else stage
                assert need in target.cfg.server.stages, f"{where}: {target.name} serves {target.cfg.server.stages}, not {need}"
                # the real stage server app: the Host the front end sends and its key must get through, and it
                # lists a model of that stage
                r = app_for(target).get("/v1/models", headers={"host": u.netloc, "authorization": f"Bearer {key}"})
                assert r.status_code == 200, f"{where}: the stage server answers {r.status_code} (Host {u.netloc}): {r.text}"
                assert KIND[need] in {m["owned_by"].removeprefix("parley (").rstrip(")") for m in r.json()["data"]}, r.text
                if speaker is not None:
                    assert target.cfg is not None
                    known = {*target.cfg.voices, *voice_aliases(target.cfg)}
                    assert speaker in known, (
                        f"{where}: speaker {speaker!r} is no voice of {target.name} (known: {sorted(known)})")
            checked += 1
    assert checked, f"{topo.name}: no remote stage at all"


def test_the_front_door_reaches_the_front_ends_with_a_host_they_allow(topo: Topology) -> None:
    for route in topo.public:
        proc, port = topo.procs[route.proc], route.port
        assert proc.kind == "parley" and proc.command == "serve", f"{route.where}: reaches {proc.name}, not a front end"
        assert port == proc.listen, f"{route.where}: reaches port {port}, {proc.name} listens on {proc.listen}"
        assert proc.cfg is not None
        r = app_for(proc).get("/healthz", headers={"host": route.host})
        assert r.status_code in (200, 503), f"{route.where}: the front end answers {r.status_code} to Host {route.host}"
        assert origin_allowed(route.origin, route.host, proc.cfg.server.allowed_origins), (
            f"{route.where}: a page from {route.origin} would be refused")
        assert route.read_timeout_s >= proc.cfg.server.idle_timeout_s, (
            f"{route.where}: the proxy closes quiet sessions after {route.read_timeout_s} s")


def test_ingress_is_websocket_friendly_and_sticky() -> None:
    (ingress,) = [d for d in k8s_docs() if d["kind"] == "Ingress"]
    notes = ingress["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert notes[prefix + "affinity"] == "cookie" and notes.get(prefix + "session-cookie-name")
    assert float(notes[prefix + "proxy-send-timeout"]) >= 300 and float(notes[prefix + "proxy-read-timeout"]) >= 300


def test_vllm_is_on_a_gpu_with_prefix_caching() -> None:
    topo = load_k8s()
    (vllm,) = [p for p in topo.procs.values() if p.kind == "vllm"]
    assert "--enable-prefix-caching" in vllm.argv
    assert str(vllm.resources["limits"]["nvidia.com/gpu"]) == "1"
    assert "VLLM_API_KEY" in vllm.env or vllm_flag(vllm.argv, "--api-key")
    compose = load_compose(("compose.gpu.yaml",), frozenset({"gpu"}))
    (cvllm,) = [p for p in compose.procs.values() if p.kind == "vllm"]
    assert "--enable-prefix-caching" in cvllm.argv
    assert compose.raw["services"]["vllm"]["profiles"] == ["gpu"]


def test_no_secret_values_in_the_manifests_and_the_secret_is_documented() -> None:
    docs = k8s_docs()
    assert not [d for d in docs if d["kind"] == "Secret"], "a Secret with values belongs to the cluster, not to deploy/"
    refs = set()
    for d in docs:
        for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            for item in c.get("env", []):
                if "secretKeyRef" in item.get("valueFrom", {}):
                    refs.add((item["valueFrom"]["secretKeyRef"]["name"], item["valueFrom"]["secretKeyRef"]["key"]))
    assert refs
    text = DOCS.read_text()
    for name, key in refs:
        assert f"kubectl create secret generic {name}" in text and f"--from-literal={key}=" in text, (name, key)
    for d in docs:
        for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            for item in c.get("env", []):
                assert not re.search(r"(TOKEN|KEY|SECRET|PASSWORD)", item["name"]) or "valueFrom" in item, item


def test_kubernetes_runs_the_images_user() -> None:
    uid = re.search(r"^USER\s+(\d+)", DOCKERFILE.read_text(), re.M)
    assert uid, "deploy/Dockerfile: USER should be numeric (runAsNonRoot cannot check a name)"
    for d in k8s_docs():
        if d["kind"] == "Deployment" and d["spec"]["template"]["spec"]["containers"][0]["image"].startswith("parley"):
            ctx = d["spec"]["template"]["spec"].get("securityContext", {})
            assert str(ctx.get("runAsUser")) == uid.group(1) and ctx.get("runAsNonRoot"), d["metadata"]["name"]


def test_dockerfile_installs_what_setup_installs() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pins = set(re.findall(r"\b([A-Za-z][\w.-]*==[\w.+-]+)", setup))
    assert pins and pins <= set(re.findall(r"\b([A-Za-z][\w.-]*==[\w.+-]+)", text)), pins
    torch_pin = re.search(r"^torch==(\S+)", (ROOT / "constraints.txt").read_text(), re.M).group(1)  # type: ignore[union-attr]
    assert f"torch=={torch_pin}" in text
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    steps = [step for step in re.sub(r"\\\n", " ", code).split("&&") if "pip install" in step]
    assert len(steps) >= 3, steps
    for step in steps:  # torch alone comes from its CPU index, the rest under the pins
        assert "-c constraints.txt" in step or step.split()[-1] == f"torch=={torch_pin}", f"pip install without the pins: {step!r}"
    apt = set(re.findall(r"apt-get install[^&]*", text, re.S)[0].split())
    needed = {"libportaudio2", "g++"}
    needed |= {v.backend for v in load_config(None, []).voices.values() if v.backend in ("flite", "espeak-ng")}
    assert needed <= apt, f"the shipped config needs {sorted(needed - apt)} in the image"
    cmd = dockerfile_cmd()
    args, unknown = cli._parser().parse_known_args(cmd[1:])
    assert cmd[0] == "parley" and not unknown and args.command in ("serve", "stages")
    ignored = {line.strip() for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()}
    assert {".venv", ".git", "artifacts"} <= ignored, "the build context would carry the virtualenv and artifacts"


# -- docs/deploy.md ---------------------------------------------------------------------------------------------------


def _doc_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOCS.read_text(), re.S)


_DOC_PARLEY = re.compile(r"^(?:\w+=\S+\s+)*(?:\S*/)?parley\s")  # `[VAR=value ...] [path/]parley ...`


def _doc_commands() -> list[list[str]]:
    """The arguments of every `parley` command line in the page's sh blocks (one simple command each)."""
    out = []
    for block in _doc_blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#[^'\"]*$", "", line).strip()
            if _DOC_PARLEY.match(line):
                argv = sh_words(line, HOST_ENV)
                i = next(i for i, w in enumerate(argv) if w == "parley" or w.endswith("/parley"))
                out.append(argv[i + 1 :])
    return out


def test_docs_commands_and_config_snippets_load() -> None:
    commands = _doc_commands()
    assert len(commands) >= 3, commands
    for argv in commands:
        args, unknown = cli._parser().parse_known_args(argv)
        assert not unknown, argv
        try:
            cli._load(args)
        except ConfigError as exc:
            pytest.fail(f"docs/deploy.md: `parley {' '.join(argv)}`: {exc}")
    snippets = [yaml.safe_load(b) for b in _doc_blocks("yaml")]
    snippets = [s for s in snippets if isinstance(s, dict) and set(s) <= set(AppConfig.model_fields)]
    assert snippets
    base = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for snippet in snippets:
        data = _merge(base, snippet)
        data["personas_dir"] = str(DEFAULT_CONFIG.parent / data.get("personas_dir", "personas"))
        AppConfig.model_validate(data)  # a wrong key or value fails here


def test_docs_base_urls_name_real_services_and_ports() -> None:
    topos = [f() for f in TOPOLOGIES.values()]
    urls = re.findall(r"base_url: \"?(https?://[^\"}\s,]+)", DOCS.read_text())
    assert urls
    for url in urls:
        u = urlsplit(url)
        owners = [t for t in topos if u.hostname in t.dns]
        if not owners:  # a loopback or an example elsewhere
            assert u.hostname in ("127.0.0.1", "localhost") or u.hostname.endswith(".example.com"), url  # type: ignore[union-attr]
            continue
        for t in owners:
            target, port = t.reach(u.hostname or "", u.port or 80)
            assert port == target.listen, f"docs/deploy.md: {url}: {target.name} listens on {target.listen}"
