"""Config files -> frozen, validated config objects.

Reads configs/default.yaml (or --config FILE), applies `--set a.b=value` overrides, loads the
personas it names and checks cross-references (persona voice, default persona). Every problem
becomes one ConfigError line naming the file, the key and the reason. Knows nothing of models.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from voice.trace import STAGES


def shipped_configs() -> Path:
    """The shipped configs/ folder: inside the installed package (the wheel maps the top-level configs/ to
    parley/configs), else the checkout's top level."""
    here = Path(__file__).resolve().parent
    installed = here / "configs"
    return installed if (installed / "default.yaml").is_file() else here.parent / "configs"


DEFAULT_CONFIG = shipped_configs() / "default.yaml"
TRACE_STAGES = tuple(STAGES)  # the stage names budgets may name


class ConfigError(Exception):
    """One line: `<file>: <key>: <reason>`."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VadModel(_Strict):
    backend: Literal["silero", "webrtc"] = "silero"
    source: str = "embedded"  # silero weights; webrtc has none


class VadConfig(_Strict):
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    webrtc_aggressiveness: int = Field(2, ge=0, le=3)
    min_speech_ms: int = Field(120, ge=0)
    ahead_silence_ms: int = Field(32, ge=0)  # silence before the final recognition starts, ahead of the endpoint
    turn_detection: Literal["fixed", "smart_turn", "text", "combined"] = "combined"
    hangover_ms: int = Field(500, ge=0)  # fixed: the silence that ends a turn
    turn_check_ms: int = Field(160, ge=0)  # the others: the silence that starts an end-of-turn check
    max_hangover_ms: int = Field(1000, ge=0)  # the longest silence inside one turn
    turn_sure_prob: float = Field(0.8, gt=0.0, lt=1.0)
    turn_unsure_prob: float = Field(0.5, gt=0.0, lt=1.0)
    turn_audio_weight: float = Field(0.25, ge=0.0)
    # speech under a reply holds it; "words": it stops only for a real interruption (docs/turn-taking.md,
    # Interruptions); "duration": any speech of barge_in_min_speech_ms stops it
    interrupt_by: Literal["words", "duration"] = "words"
    barge_in_min_speech_ms: int = Field(200, ge=0)  # duration: a cough or "uh-huh" is shorter
    interject_release_ms: int = Field(500, ge=0)  # words: noise or echo this long resumes the reply while it goes on
    interject_max_hold_ms: int = Field(1500, ge=0)  # words: the longest a reply is held for speech that has not interrupted
    backchannels: list[str] | None = None  # words: replaces the built-in list (voice/interjection.py) for another language
    stop_words: list[str] | None = None  # words: likewise, the words that stop a reply on their own
    thinking: list[str] | None = None  # likewise, a turn of nothing but these gets no reply ("um", "let me think")
    server_aec: bool = True  # take the replies' echo out of the microphone on the server (WebRTC AEC3, voice/echo.py)
    rejoin_window_ms: int = Field(1000, ge=0)
    rejoin_react_ms: int = Field(250, ge=0)  # ... unless it began this long after the reply became audible
    max_turn_ms: int = Field(30000, ge=1000)  # one utterance ends at this length
    # the reply's first phrase decoded and synthesised in the pause, held until the endpoint (voice/first_phrase.py);
    # shed while the shared stages' waited jobs queue longer than preemptive_shed_wait_ms (p95) or others use the engine
    preemptive_phrase: bool = True
    preemptive_shed_wait_ms: float = Field(50.0, ge=0)
    # while the user speaks, each partial transcript's reply prompt is prefilled (when the machine is not busy), so
    # the prefill at the pause computes only the last words: the text's score and the first phrase come sooner
    warm_partials: bool = True
    # the end-of-turn check's audio model runs at the pause (on the turn with its silence to come filled in), beside
    # the final recognition, not at turn_check_ms beside the first phrase's decode and synthesis
    audio_check_ahead: bool = True

    @model_validator(mode="after")
    def _ordered(self) -> "VadConfig":
        if self.turn_unsure_prob > self.turn_sure_prob:
            raise ValueError(f"turn_unsure_prob ({self.turn_unsure_prob}) is above turn_sure_prob ({self.turn_sure_prob})")
        if not self.ahead_silence_ms <= self.turn_check_ms <= self.max_hangover_ms:
            raise ValueError(f"need ahead_silence_ms ({self.ahead_silence_ms}) <= turn_check_ms ({self.turn_check_ms}) "
                             f"<= max_hangover_ms ({self.max_hangover_ms})")
        return self


class AudioConfig(_Strict):
    # noise suppression before VAD and recognition, after the echo canceller (voice/denoise.py; docs/benchmarks.md,
    # "Noisy rooms", for what each costs and buys)
    denoise: Literal["none", "rnnoise", "deepfilternet"] = "none"


class StorageConfig(_Strict):
    # where conversations live (parley/conversation_db.py): "default" is SQLite in the user's data directory;
    # "sqlite:///path", "postgresql+psycopg://user:pass@host/db" (several front ends sharing conversations); "memory":
    # this process only (a restart loses them)
    url: str = "default"


class Remote(_Strict):
    """A stage behind an OpenAI-compatible server (vLLM, SGLang, llama.cpp, Ollama, speaches, `parley stages`)."""

    base_url: str = Field(pattern=r"^https?://")  # e.g. http://llm:8000/v1
    model: str = ""  # the name the server knows the model by ("" lets a single-model server choose)
    api_key_env: str | None = None  # the environment variable holding the key (never the key in a file)
    timeout_s: float = Field(30.0, gt=0)


class AsrModel(_Strict):
    backend: Literal["local", "openai"] = "local"
    remote: Remote | None = None  # backend openai: the server; only final transcripts go there (no partials)
    source: str = "embedded"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    compute_type: str = "int8_float32"
    beam_size: int = Field(1, ge=1)
    window: Literal["fit", "full"] = "fit"  # fit: encode over a window fitted to the utterance (voice.asr)


class AsrConfig(_Strict):
    partial_interval_ms: int = Field(500, ge=100)  # how often the growing utterance is re-decoded
    partial_busy_interval_ms: int = Field(2000, ge=0)  # ... while the machine cannot spare it (0: as partial_interval_ms)


class LlmConfig(_Strict):
    backend: Literal["local", "openai"] = "local"
    remote: Remote | None = None  # backend openai: the server (the engine settings below then do not apply)
    source: str = "embedded"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    quant: Literal["none", "int8", "int4"] = "none"
    group_size: int = Field(32, ge=8)  # int4 group size (the embedded Q4_1 file loads exactly at 32)
    self_draft: Literal["none", "int8", "int4"] = "none"  # speculative decoding from a quantized copy
    cuda_graphs: bool = False  # capture the decode step (CUDA only; ignored on CPU)
    native: Literal["auto", "on", "off"] = "auto"  # the compiled CPU decode step (llm_engine/native)
    kv_cache: Literal["auto", "float32", "float16", "bfloat16", "int8"] = "auto"  # auto: float16 for a float32 model on CPU
    max_seq_len: int = Field(2048, ge=128)
    summarise_history: bool = True  # the oldest turns summarised ahead instead of dropped (voice.summary)
    max_slots: int = Field(8, ge=1)
    prefix_cache: bool = True  # a new session copies a prompt prefix (the persona) another idle slot holds
    # while others decode, a prompt chunk takes as many tokens as fit this long at the model's measured cost a token
    # (at most 128: SmolLM2-135M's ~0.15 s; ~18 on Qwen2.5-0.5B, whose 128 stalled every reply ~1 s); 0: always 128
    chunk_budget_ms: float = Field(150.0, ge=0)


class VoiceConfig(_Strict):
    backend: Literal["piper", "flite", "espeak-ng", "coqui", "openai"]
    source: str = "embedded"
    speaker: str | None = None  # openai: the server's voice name (default alloy)
    description: str = ""
    remote: Remote | None = None  # backend openai: the speech server

    @model_validator(mode="after")
    def _remote(self) -> "VoiceConfig":
        _needs_remote(self.backend, self.remote)
        return self


def _needs_remote(backend: str, remote: Remote | None) -> None:
    if backend == "openai" and remote is None:
        raise ValueError("backend openai needs remote.base_url")


class TurnModelConfig(_Strict):
    source: str = "embedded"  # Smart Turn v3 ONNX: embedded (inside the pipecat-ai wheel) or a file


class ModelsConfig(_Strict):
    allow_downloads: bool = False
    vad: VadModel = VadModel()
    turn: TurnModelConfig = TurnModelConfig()
    asr: AsrModel = AsrModel()
    llm: LlmConfig = LlmConfig()

    @model_validator(mode="after")
    def _remotes(self) -> "ModelsConfig":
        _needs_remote(self.asr.backend, self.asr.remote)
        _needs_remote(self.llm.backend, self.llm.remote)
        return self


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_sessions: int = Field(32, ge=1)  # a bound on memory and connections; the cost model decides before it
    allowed_origins: tuple[str, ...] = ("http://127.0.0.1:8000", "http://localhost:8000")
    token: str | None = None
    trace_log: str = "traces.jsonl"
    allowed_hosts: tuple[str, ...] = ()  # Host names besides the loopback ones and `host`; "*": any
    idle_timeout_s: float = Field(300.0, gt=0)
    handshake_timeout_s: float = Field(5.0, gt=0)  # a connection that sends no session.start in time is closed
    max_pending: int = Field(8, ge=1)  # connections without a session; past it the one waiting longest goes
    max_message_bytes: int = Field(1 << 20, ge=1024)
    max_messages_per_s: float = Field(200.0, gt=0)
    audio_burst_s: float = Field(2.0, gt=0)  # audio a client may send ahead of real time before it is dropped
    audio_lead_s: float = Field(1.0, gt=0)  # reply audio sent ahead of real-time playback (what a barge-in drops)
    max_connections: int = Field(1000, ge=1)  # open TCP connections; more are refused at once
    header_timeout_s: float = Field(10.0, gt=0)  # a request's headers must be in by then
    max_header_bytes: int = Field(65536, ge=4096)
    shutdown_grace_s: float = Field(10.0, ge=0)  # SIGTERM: how long running replies may go on before the close
    # a connection that drops (not closed by its client) leaves its conversation this long for a reconnect with the
    # session.ready's resume_token (web/resume.py); 0: never
    resume_window_s: float = Field(60.0, ge=0)
    # recognition, synthesis and turn checks: "priority" runs them on a few shared workers, what a user waits for
    # first (voice.scheduler); "direct" runs each on its own thread at once (the behaviour before, for comparison)
    scheduling: Literal["priority", "direct"] = "priority"
    stage_workers: int = Field(0, ge=0)  # shared-stage workers; 0: from the core count (parley.thread_budget)
    # admission (web.admission): conversations per core that hold their budgets, measured by bench/load.py (0: no
    # such limit; max_sessions still applies), and the queue wait of finals and first phrases past which new
    # sessions are refused until the machine catches up (0: never)
    sessions_per_core: float = Field(4.0, ge=0)
    admit_max_wait_ms: float = Field(400.0, ge=0)
    admit_v2v_ratio: float = Field(1.5, ge=0)  # refuse while recent turns' voice-to-voice p95 > this x its budget
    # admission from committed work (web.capacity): each session's measured load in cores (engine steps,
    # recognition, checks, synthesis; not the partials and preemptive phrases shed under load) plus a newcomer's
    # (what the measured sessions cost on average, at most a heavy session's 1 / sessions_per_core) against the cores;
    # it replaces the sessions_per_core count and the voice-to-voice rule (false: those two, as before)
    admit_cost_model: bool = True
    # ... and the engine apart: the sessions' shares of its wall time plus a newcomer's against this part of it (one
    # serial resource: a model whose steps cost more fills it before the cores; 0: not priced apart)
    admit_engine_share: float = Field(0.5, ge=0, le=1)
    openai_api: bool = False  # `parley serve` also answers the OpenAI-compatible routes (`parley stages` always does)
    # what `parley stages` loads and serves: every stage, or one stage server per stage (`parley stages --only llm`);
    # `parley serve` loads every stage its sessions use, whatever this says
    stages: tuple[Literal["asr", "llm", "tts"], ...] = ("asr", "llm", "tts")
    openai_voices: dict[str, str] = Field(default_factory=dict)  # OpenAI voice name -> a configured voice

    @field_validator("stages")
    @classmethod
    def _some_stages(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v or len(set(v)) != len(v):
            raise ValueError("name each of asr, llm, tts at most once, and at least one")
        return v


class TwilioConfig(_Strict):
    """Phone calls through Twilio Media Streams (web.twilio, web.twilio_voice)."""

    auth_token_env: str | None = None  # the variable holding the account's auth token; set: signatures are checked
    public_url: str | None = Field(None, pattern=r"^https://")  # the server as Twilio reaches it (what it signs)
    persona: str | None = None  # who answers the phone (default: default_persona)


class IceServer(_Strict):
    """A STUN or TURN server for WebRTC (docs/deploy.md, Behind TURN)."""

    urls: tuple[str, ...] = Field(min_length=1)  # stun:host:3478, turn:host:3478?transport=udp, turns:host:5349
    username: str | None = None
    credential_env: str | None = None  # the variable holding the TURN password (never the password in a file)


class WebRtcConfig(_Strict):
    ice_servers: tuple[IceServer, ...] = ()  # none: host candidates only, nothing asks a server outside


_TOOL_FUNCTION = r"^[\w.]+:\w+$"


class PersonaTool(_Strict):
    """A server-side tool (docs/tools.md): a Python function, its JSON schema read from its signature."""

    function: str = Field(pattern=_TOOL_FUNCTION)  # module:function
    timeout_s: float = Field(10.0, gt=0, le=600)
    cancellable: bool = True  # a barge-in cancels the call (False: it runs to its end; its result is dropped)


# what ships for a voice assistant: the time, arithmetic, a timer that speaks when due (`tools: default`)
DEFAULT_TOOLS = ("voice.builtin_tools:current_time", "voice.builtin_tools:calculate", "voice.timers:set_timer")


def _tool_entry(i: int, entry: Any) -> str | PersonaTool:
    """One entry of a persona's tools: list, checked with a message naming it."""
    if isinstance(entry, str):
        if entry != "default" and not re.fullmatch(_TOOL_FUNCTION, entry):
            raise ValueError(f"tools[{i}]: {entry!r} is neither default nor module:function")
        return entry
    if not isinstance(entry, (dict, PersonaTool)):
        raise ValueError(f"tools[{i}]: {entry!r} is neither module:function nor {{function, timeout_s, cancellable}}")
    try:
        return PersonaTool.model_validate(entry)
    except ValidationError as err:
        key, msg = _first_error(err)
        raise ValueError(f"tools[{i}].{key}: {msg}") from None


class Persona(_Strict):
    name: str
    display_name: str
    system_prompt: str
    greeting: str | None = None
    voice: str
    speaking_rate: float = Field(1.0, ge=0.5, le=2.0)
    max_reply_tokens: int = Field(120, ge=1, le=2048)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    # auto: DEFAULT_TOOLS where the LLM can call tools (a remote LLM, or a chat template that renders tools), none on
    # a model without (the embedded SmolLM2: they lengthen its prompt ~7x and it never picks one); parley.tool_offer.
    # A list is offered as it is, on any model: module:function, {function, timeout_s, cancellable}, or "default"
    # (DEFAULT_TOOLS); [] is none.
    tools: Literal["auto"] | tuple[str | PersonaTool, ...] = "auto"
    tool_choice: str = "auto"  # auto | required | none | one tool's function name (called in every reply)
    tool_filler: str = Field("One moment.", min_length=1, max_length=200)  # said while a tool runs over ~300 ms
    # the words that decide an interruption in this persona's conversations (its language): each replaces vad's list
    backchannels: list[str] | None = None
    stop_words: list[str] | None = None
    memory: bool = False  # remember facts the user states, for their next conversations (voice/user_memory.py)

    @field_validator("tools", mode="before")
    @classmethod
    def _tools(cls, v: Any) -> Any:
        """One clear message (pydantic's for a union names both of its members)."""
        if v == "auto":
            return v
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"{v!r} is not a list: tools is auto (the default), a list (e.g. [default] or "
                             "[mypackage.tools:weather]) or [] for none")  # fmt: skip
        return tuple(_tool_entry(i, entry) for i, entry in enumerate(v))

    @field_validator("tool_choice")
    @classmethod
    def _choice(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("tools") == "auto" and v not in ("auto", "none"):
            raise ValueError(f"{v!r} forces a call, so it needs the tools listed (e.g. tools: [default]): tools: auto "
                             "offers none on an LLM that cannot call tools")  # fmt: skip
        return v


class ObservabilityConfig(_Strict):
    """OpenTelemetry export of every turn (docs/observability.md). Off unless an endpoint is set here or in the
    standard OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT variables."""

    otlp_endpoint: str | None = Field(None, pattern=r"^https?://")  # e.g. http://jaeger:4318 (/v1/traces is added)
    # OTLP over HTTP/protobuf (port 4318) or gRPC (4317); null: OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL, else http/protobuf
    otlp_protocol: Literal["http/protobuf", "grpc"] | None = None
    headers: dict[str, str] = Field(default_factory=dict)  # sent with each export (e.g. a Langfuse auth header)
    service_name: str = "parley"
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)  # share of sessions whose spans are kept
    include_text: bool = False  # transcripts and replies as span attributes (off: timings and counts only)
    max_queue_spans: int = Field(2048, ge=1)  # spans waiting for export; past it new ones are dropped and counted
    max_export_batch: int = Field(512, ge=1)
    schedule_delay_ms: float = Field(1000.0, gt=0)  # how long a batch may wait before it is sent
    export_timeout_s: float = Field(10.0, gt=0)  # one export request's limit (a collector that never answers)


class AppConfig(_Strict):
    models: ModelsConfig = ModelsConfig()
    vad: VadConfig = VadConfig()
    audio: AudioConfig = AudioConfig()
    storage: StorageConfig = StorageConfig()
    asr: AsrConfig = AsrConfig()
    budgets_ms: dict[Literal[TRACE_STAGES], float] = Field(default_factory=dict)  # type: ignore[valid-type]
    server: ServerConfig = ServerConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    twilio: TwilioConfig = TwilioConfig()
    webrtc: WebRtcConfig = WebRtcConfig()
    voices: dict[str, VoiceConfig]
    personas: tuple[str, ...]
    personas_dir: str = "personas"
    default_persona: str
    tools_time_zone: str = ""  # the time tool's zone when a call names none (IANA, e.g. Europe/Paris); "": the server's
    persona_defs: dict[str, Persona] = Field(default_factory=dict, exclude=True)
    source_file: str = ""

    def persona(self, name: str | None) -> Persona:
        return self.persona_defs[name or self.default_persona]

    @field_validator("tools_time_zone")
    @classmethod
    def _time_zone(cls, v: str) -> str:
        if v:
            try:
                ZoneInfo(v)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"unknown time zone {v!r} (an IANA name such as Europe/Paris, or \"\" for the server's own)") from None
        return v


def _first_error(err: ValidationError) -> tuple[str, str]:
    e = err.errors()[0]
    key = ".".join(str(p) for p in e["loc"]) or "(top level)"
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        msg = "unknown key"
    elif "input" in e and e["type"] not in ("missing",):
        msg = f"{msg} (got {e['input']!r})"
    return key, msg


def apply_override(data: dict[str, Any], assignment: str, origin: str = "--set") -> None:
    """`a.b.c=value` sets a nested key; the value is parsed as YAML (so 8000 is an int)."""
    if "=" not in assignment:
        raise ConfigError(f"{origin}: {assignment!r}: expected KEY=VALUE")
    dotted, raw = assignment.split("=", 1)
    keys = dotted.strip().split(".")
    node = data
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {dotted}: {k!r} is not a section")
        node = child
    try:
        node[keys[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: {dotted}: value is not valid YAML ({exc.__class__.__name__})") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: file does not exist") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(parse)"
        raise ConfigError(f"{path}: {where}: invalid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: (top level): expected a mapping, got {type(data).__name__}")
    return data


def load_persona(path: Path, voices: Mapping[str, VoiceConfig]) -> Persona:
    data = _read_yaml(path)
    data.setdefault("name", path.stem)
    try:
        persona = Persona.model_validate(data)
    except ValidationError as err:
        key, msg = _first_error(err)
        raise ConfigError(f"{path}: {key}: {msg}") from None
    if persona.voice not in voices:
        raise ConfigError(f"{path}: voice: unknown voice {persona.voice!r} (known: {', '.join(sorted(voices))})")
    return persona


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> AppConfig:
    """Load, override, validate. Raises ConfigError with one clear line."""
    cfg_path = Path(path) if path else DEFAULT_CONFIG
    data = _read_yaml(cfg_path)
    for item in overrides:
        apply_override(data, item)
    data.pop("persona_defs", None)
    try:
        cfg = AppConfig.model_validate(data)
    except ValidationError as err:
        key, msg = _first_error(err)
        raise ConfigError(f"{cfg_path}: {key}: {msg}") from None
    for stage, budget in cfg.budgets_ms.items():
        if budget < 0:
            raise ConfigError(f"{cfg_path}: budgets_ms.{stage}: budget must be >= 0 (got {budget})")
    for alias, voice in cfg.server.openai_voices.items():
        if voice not in cfg.voices:
            raise ConfigError(f"{cfg_path}: server.openai_voices.{alias}: unknown voice {voice!r} (known: {', '.join(sorted(cfg.voices))})")
    personas_dir = (cfg_path.parent / cfg.personas_dir).resolve()
    defs: dict[str, Persona] = {}
    for i, name in enumerate(cfg.personas):
        file = personas_dir / f"{name}.yaml"
        if not file.is_file():
            raise ConfigError(f"{cfg_path}: personas[{i}]: persona file {file} does not exist")
        defs[name] = load_persona(file, cfg.voices)
    if cfg.default_persona not in defs:
        raise ConfigError(f"{cfg_path}: default_persona: {cfg.default_persona!r} is not in personas {list(cfg.personas)}")
    if cfg.twilio.persona is not None and cfg.twilio.persona not in defs:
        raise ConfigError(f"{cfg_path}: twilio.persona: {cfg.twilio.persona!r} is not in personas {list(cfg.personas)}")
    return cfg.model_copy(update={"persona_defs": defs, "source_file": str(cfg_path)})
