"""Builds the stage objects once from the config (VAD factory, recogniser, engine, one TTS per backend) and
warms them, so no turn pays for loading. Also turns config objects into the plain settings voice/ takes.
It knows nothing of sockets or sessions' inner workings.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice.audio import resample
from voice.interjection import Lexicon
from voice.reply import VoiceBinding
from voice.stages import PersonaSpec, SessionSettings, Stages
from voice.turn_policy import TurnPolicy
from voice.vad import Vad
from parley.config import AppConfig, ConfigError
from parley.locate import resolve
from parley.thread_budget import ThreadBudget, available_cores
from parley.tool_offer import NOT_LOADED, ToolSupport, llm_tool_support, offered_entries

log = logging.getLogger(__name__)


ALL_STAGES = frozenset({"asr", "llm", "tts"})


class NotServed:
    """The place of a stage this process was not asked to load (`parley stages --only ...`): the routes check
    Runtime.served first, so any use of it is a bug, and says so (as an AttributeError, so that
    `getattr(stage, name, default)` still answers the default)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{self.stage} is not served by this process (server.stages), so it has no {name}")

    def __call__(self, *args: Any) -> Any:  # the VAD's place is a factory
        raise RuntimeError(f"{self.stage} is not loaded by this process: it serves no voice sessions")


@dataclass
class Runtime:
    stages: Stages
    engine: Any  # llm_engine Engine (or a fake with its shape); stopped by close(); None when the LLM is remote
    load_s: dict[str, float] = field(default_factory=dict)
    threads: ThreadBudget | None = None
    served: frozenset[str] = ALL_STAGES  # of asr, llm, tts: what was loaded (`parley stages --only` loads fewer)
    sessions: bool = True  # the VAD and the turn model were loaded: voice sessions can run (`parley stages`: no)
    engine_turn_share: float | None = None  # a talking session's share of our engine, timed at start (calibrate_engine)

    def close(self) -> None:
        stop = getattr(self.engine, "stop", None)
        if stop is not None:
            stop()
        close = getattr(self.stages.runner, "close", None)
        if close is not None:
            close()


def personas(cfg: AppConfig, support: ToolSupport = NOT_LOADED) -> dict[str, PersonaSpec]:
    """The personas as sessions use them. `support`: whether the LLM can call tools (tool_offer.llm_tool_support),
    which decides what `tools: auto` offers; not known until the LLM stage is loaded (then auto offers none)."""
    specs = {}
    for name in cfg.persona_defs:
        specs[name] = spec = persona_spec(cfg, name, support)
        if support is not NOT_LOADED:
            log.info("persona %s: tools %s (%s)", name, ", ".join(t.spec.name for t in spec.tools) or "none", spec.tools_why)
    return specs


def persona_spec(cfg: AppConfig, name: str, support: ToolSupport = NOT_LOADED) -> PersonaSpec:
    """One persona as sessions use it (see personas)."""
    v, p = cfg.vad, cfg.persona_defs[name]
    tools, why = persona_tools(name, p, support, time_zone=cfg.tools_time_zone)
    return PersonaSpec(
        name=p.name, system_prompt=p.system_prompt, voice=p.voice, greeting=p.greeting,
        speaking_rate=p.speaking_rate, max_reply_tokens=p.max_reply_tokens, temperature=p.temperature,
        tools=tools, tool_choice=p.tool_choice, tool_filler=p.tool_filler, tools_why=why, memory=p.memory,
        lexicon=None if p.backchannels is None and p.stop_words is None else Lexicon.of(
            v.backchannels if p.backchannels is None else p.backchannels, v.stop_words if p.stop_words is None else p.stop_words,
            v.thinking),
    )  # fmt: skip


def persona_tools(name: str, p: Any, support: ToolSupport = NOT_LOADED, time_zone: str = "") -> tuple[tuple[Any, ...], str]:
    """A persona's tools loaded (voice.tool_registry) and why these (parley.tool_offer); ConfigError naming the
    persona and the tool. `time_zone` (the config's tools_time_zone): the shipped time tool's zone when a call names
    none."""
    import dataclasses

    from parley.config import ConfigError, PersonaTool
    from voice import builtin_tools
    from voice.tool_registry import load

    entries, why = offered_entries(p, support)
    tools = []
    for i, entry in enumerate(entries):
        try:
            t = entry if isinstance(entry, PersonaTool) else PersonaTool(function=entry)
            tool = load(t.function, timeout_s=t.timeout_s, cancellable=t.cancellable)
            if tool.fn is builtin_tools.current_time and time_zone:
                tool = dataclasses.replace(tool, fn=builtin_tools.current_time_in(time_zone))
            tools.append(tool)
        except (ValueError, TypeError) as exc:  # (pydantic's ValidationError is a ValueError)
            raise ConfigError(f"persona {name}: tools[{i}]: {exc}") from None
    names = [t.spec.name for t in tools]
    if len(set(names)) != len(names):
        raise ConfigError(f"persona {name}: tools: two tools of one name ({', '.join(names)})")
    if p.tool_choice not in ("auto", "required", "none", *names):
        raise ConfigError(f"persona {name}: tool_choice: {p.tool_choice!r} is none of auto, required, none, {', '.join(names)}")
    return tuple(tools), why


def output_sample_rate(cfg: AppConfig) -> int:
    """One rate for every session's audio: Piper's 22.05 kHz when a Piper voice exists, else a speech server's
    24 kHz when one is configured, else 16 kHz."""
    backends = {v.backend for v in cfg.voices.values()}
    return 22050 if "piper" in backends else 24000 if "openai" in backends else 16000


def turn_policy(cfg: AppConfig) -> TurnPolicy:
    v = cfg.vad
    return TurnPolicy(
        detection=v.turn_detection, min_speech_ms=v.min_speech_ms, ahead_silence_ms=v.ahead_silence_ms, hangover_ms=v.hangover_ms, turn_check_ms=v.turn_check_ms,
        max_hangover_ms=v.max_hangover_ms, sure_prob=v.turn_sure_prob, unsure_prob=v.turn_unsure_prob,
        audio_weight=v.turn_audio_weight, barge_in_min_speech_ms=v.barge_in_min_speech_ms, rejoin_window_ms=v.rejoin_window_ms,
        rejoin_react_ms=v.rejoin_react_ms,
        max_turn_ms=v.max_turn_ms, interrupt_by=v.interrupt_by, interject_release_ms=v.interject_release_ms,
        interject_max_hold_ms=v.interject_max_hold_ms, lexicon=Lexicon.of(v.backchannels, v.stop_words, v.thinking),
    )  # fmt: skip


def session_settings(cfg: AppConfig, **overrides: Any) -> SessionSettings:
    base = SessionSettings(
        turns=turn_policy(cfg),
        vad_threshold=cfg.vad.threshold,
        partial_interval_ms=cfg.asr.partial_interval_ms,
        partial_busy_interval_ms=cfg.asr.partial_busy_interval_ms,
        budgets_ms=dict(cfg.budgets_ms),
        # ~3-4 characters a token in English: the history takes at most about half the context, the reply and the
        # system prompt the rest
        history_chars=int(cfg.models.llm.max_seq_len * 4 * 0.5),
        summarise_history=cfg.models.llm.summarise_history,
        output_sample_rate=output_sample_rate(cfg),
        audio_lead_ms=1000.0 * cfg.server.audio_lead_s,
        server_aec=cfg.vad.server_aec,
        preemptive_phrase=cfg.vad.preemptive_phrase,
        preemptive_shed_wait_ms=cfg.vad.preemptive_shed_wait_ms,
        warm_partials=cfg.vad.warm_partials,
        audio_check_ahead=cfg.vad.audio_check_ahead,
    )
    return SessionSettings(**{**base.__dict__, **overrides})


def _vad_factory(cfg: AppConfig) -> Callable[[], Vad]:
    m = cfg.models.vad
    if m.backend == "webrtc":
        from voice.vad import WebRtcVad

        aggressiveness = cfg.vad.webrtc_aggressiveness
        return lambda: WebRtcVad(aggressiveness, 16000, 30)
    from voice.vad import SileroVad

    path = resolve("vad", m.source, allow_downloads=cfg.models.allow_downloads)
    return lambda: SileroVad(path)


def remote_spec(remote: Any) -> Any:
    from voice.remote.client import RemoteSpec

    return RemoteSpec(remote.base_url, remote.model, remote.api_key_env, remote.timeout_s)


def _voices(cfg: AppConfig, out_rate: int, threads: int = 0) -> dict[str, VoiceBinding]:
    """One Tts object per backend (and per Piper model file or speech server), shared by the voices that name it."""
    from voice.tts import CommandTts, CoquiTts, PiperTts

    backends: dict[tuple[str, str], Any] = {}
    voices: dict[str, VoiceBinding] = {}
    for name, v in cfg.voices.items():
        key = (v.backend, v.remote.model_dump_json() if v.remote else v.source if v.backend in ("piper", "coqui") else "")
        if key not in backends:
            if v.backend == "openai":
                from voice.remote.tts import RemoteTts

                backends[key] = RemoteTts(remote_spec(v.remote))
            elif v.backend == "piper":
                backends[key] = PiperTts(resolve("tts", v.source, allow_downloads=cfg.models.allow_downloads), threads=threads)
            elif v.backend == "coqui":
                backends[key] = CoquiTts(v.source, device="cpu")
            else:
                backends[key] = CommandTts(v.backend, sample_rate=out_rate)
        voices[name] = VoiceBinding(backends[key], v.speaker)
    return voices


def load(cfg: AppConfig, stages: Collection[str] = ALL_STAGES, *, sessions: bool = True) -> Runtime:
    """Load the models the config names for `stages` (of asr, llm, tts), and for voice sessions (`sessions`) the VAD
    and the turn model; raises ModelNotFound / RuntimeError with a clear message."""
    from llm_engine.engine import Engine
    from voice.asr import WhisperTranscriber
    from voice.llm_bridge import LlmBridge

    times: dict[str, float] = {}
    allow = cfg.models.allow_downloads
    budget = ThreadBudget.for_cores(available_cores(), cfg.server.stage_workers)

    make_vad: Callable[[], Vad] = NotServed("vad")
    if sessions:
        t0 = time.perf_counter()
        make_vad = _vad_factory(cfg)
        make_vad()  # load once now: a bad VAD file fails at start, not at the first session
        times["vad"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    a = cfg.models.asr
    transcriber: Any
    if "asr" not in stages:
        transcriber = NotServed("asr")
    elif a.backend == "openai":
        from voice.remote.asr import RemoteTranscriber

        transcriber = RemoteTranscriber(remote_spec(a.remote))
    else:
        transcriber = WhisperTranscriber(
            str(resolve("asr", a.source, allow_downloads=allow)), device=a.device, compute_type=a.compute_type,
            beam_size=a.beam_size, fitted_window=a.window == "fit", cpu_threads=budget.asr,
        )  # fmt: skip
    times["asr"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    m = cfg.models.llm
    engine: Any = None
    llm: Any
    if "llm" not in stages:
        llm = NotServed("llm")
    elif m.backend == "openai":
        from voice.remote.llm import RemoteLlm

        llm = RemoteLlm(remote_spec(m.remote))
    else:
        device = m.device
        if device == "auto":
            import torch  # lazy: only here do we need to ask whether a GPU exists

            device = "cuda" if torch.cuda.is_available() else "cpu"
        engine = Engine.from_path(
            resolve("llm", m.source, allow_downloads=allow), device=device, dtype=m.dtype, max_seq_len=m.max_seq_len,
            max_slots=m.max_slots, quant=m.quant, group_size=m.group_size, self_draft=m.self_draft,
            cuda_graphs=m.cuda_graphs, native=m.native, kv_cache=m.kv_cache, prefix_cache=m.prefix_cache,
            chunk_budget_ms=m.chunk_budget_ms,
        )
        engine.start()
        llm = LlmBridge(engine)
        warm_grammar(cfg, engine, llm_tool_support(llm))
        cache = engine.cache
        log.info("LLM decode steps: %s; KV cache %s, %d MB", engine.decode_path, str(cache.k.dtype).removeprefix("torch."),
                 cache.nbytes // 2**20)
    times["llm"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    voices = _voices(cfg, output_sample_rate(cfg), budget.tts) if "tts" in stages else {}
    times["tts"] = time.perf_counter() - t0

    turn_model = None
    if sessions and cfg.vad.turn_detection in ("smart_turn", "combined"):
        from voice.smart_turn import SmartTurn

        t0 = time.perf_counter()
        turn_model = SmartTurn(resolve("turn", cfg.models.turn.source, allow_downloads=allow))
        times["turn"] = time.perf_counter() - t0

    runner = stage_runner(cfg, budget)
    stats = getattr(runner, "stats", None)
    if engine is not None and stats is not None:  # the shared scheduler counts its running jobs
        engine.share_cores(lambda: budget.engine_team(stats.running))
    loaded = Stages(make_vad=make_vad, transcriber=transcriber, llm=llm, voices=voices, turn_model=turn_model,
                    runner=runner, make_denoiser=denoiser_factory(cfg) if sessions else None)  # fmt: skip
    log.info("threads on %d cores: engine %d, %d stage workers (%s), recognition %d and speech %d a job",
             budget.cores, budget.engine, budget.stage_workers, cfg.server.scheduling, budget.asr, budget.tts)
    times = {k: v for k, v in times.items() if k in stages or k in ("vad", "turn")}  # what was loaded
    return Runtime(stages=loaded, engine=engine, load_s=times, threads=budget, served=frozenset(stages), sessions=sessions)


def denoiser_factory(cfg: AppConfig) -> Callable[[], Any] | None:
    """Each session's noise suppressor (audio.denoise), built once here so a missing package fails the start, not a
    session."""
    backend = cfg.audio.denoise
    if backend == "none":
        return None
    from voice.denoise import Denoiser, DenoiseUnavailable

    try:
        Denoiser(backend)
    except DenoiseUnavailable as exc:
        raise ConfigError(str(exc)) from None
    return lambda: Denoiser(backend)


def stage_runner(cfg: AppConfig, budget: ThreadBudget) -> Any:
    """Where recognition, synthesis and turn checks run: the shared scheduler, or each on a thread at once."""
    from voice.scheduler import DirectRunner, StageScheduler
    from voice.stage_queue import Policy

    if cfg.server.scheduling == "direct":
        return DirectRunner()
    return StageScheduler(Policy.for_workers(budget.stage_workers), name="parley-stage")


WARM_SENTENCE = "Sure, I can help with that. What time would you like the reminder for?"


def warm(runtime: Runtime) -> None:
    """One pass through each stage (first-call allocations, lazy imports, ONNX sessions), the recogniser on speech:
    a sentence synthesised by the first local voice, then recognised and scored by the turn model. Warmed on noise
    instead, its VAD filter found no speech and Whisper itself never ran: the first requests' finals then took
    ~110 ms instead of ~65 (tiny.en, 2 threads, the 2-core CPU), and the first user's turn paid for it."""
    stages = runtime.stages
    if runtime.sessions:
        vad = stages.make_vad()
        vad.speech_prob(np.zeros(int(16000 * vad.frame_ms / 1000), dtype=np.float32))
    rng = np.random.default_rng(0)
    speech = (rng.standard_normal(16000) * 0.01).astype(np.float32)  # without a local voice: noise, as before
    seen: set[int] = set()
    # a remote stage is not warmed here: it may be down at start and come up later (each turn then says why)
    for binding in stages.voices.values():
        if id(binding.tts) not in seen and not _remote(binding.tts):
            seen.add(id(binding.tts))
            chunks = list(binding.tts.synthesize(WARM_SENTENCE, voice=binding.speaker))
            if len(seen) == 1 and chunks:
                speech = resample(np.concatenate(chunks), int(binding.tts.sample_rate), 16000)
    local_asr = "asr" in runtime.served and not _remote(stages.transcriber)
    if local_asr:
        stages.transcriber.transcribe(speech)
    if runtime.engine is not None:
        _run_alone(runtime.engine, _warm_request())
    if stages.turn_model is not None:
        stages.turn_model.complete_prob(speech)

    def on_a_worker() -> None:  # their first runs on each thread cost more again (ONNX Runtime: 20-50 ms)
        if stages.turn_model is not None:
            stages.turn_model.complete_prob(speech)
        if local_asr:
            stages.transcriber.transcribe(speech)

    stages.runner.on_each_worker(on_a_worker)


def pin_persona_prompt(runtime: Runtime, cfg: AppConfig) -> None:
    """The default persona's system prompt (its tools worded as sessions word them) through our engine once, at start:
    the engine pins a system prompt's keys and values (llm_engine.prefix_pins), so the first conversation copies
    them instead of computing them while its user waits. Later ones found the first one's pin anyway; the first paid
    the whole prompt: a 384-token prompt of the 1.5B took 13.6 s of its first turn (docs/models.md)."""
    if runtime.engine is None or "llm" not in runtime.served or not getattr(runtime.engine, "prefix_cache", False):
        return
    from llm_engine.engine import ChatMessage, GenerateRequest, SamplingParams
    from voice.tool_turn import with_tools

    llm = runtime.stages.llm
    persona = persona_spec(cfg, cfg.default_persona, llm_tool_support(llm))
    system = with_tools(persona.system_prompt, persona, native=llm.native_tools, wording=llm.system_with_tools)
    _run_alone(runtime.engine, GenerateRequest(PIN_SESSION, (ChatMessage("system", system),), SamplingParams(max_new_tokens=0)))


PIN_SESSION = "__persona__"

# A talking user's turn, for pricing one before it is measured (web.capacity): the new prompt tokens a turn runs (its
# words, the turn check's probes and partials' warm-ups, the reply kept in the history; bench/load.py's turns ran
# ~40-70) and the reply tokens it decodes (the personas' replies ran ~30-60), one turn every TURN_PERIOD_S (a spoken
# request of ~2 s, the reply's ~5 s of audio and the pause between).
TURN_PROMPT_TOKENS, TURN_REPLY_TOKENS, TURN_PERIOD_S = 60, 48, 8.0


def calibrate_engine(runtime: Runtime, cfg: AppConfig) -> float | None:
    """A talking session's share of our engine's wall time on this machine and model: one request after the default
    persona's prompt (prefill cost a token, decode cost a token) priced at a turn's tokens, over a turn's period.
    Admission prices a session it has not measured yet at this (web.capacity): on two cores the 0.5B's turns fill
    the engine with two or three talkers where the 135M's take eight. None: no engine of ours."""
    if runtime.engine is None or "llm" not in runtime.served:
        return None
    from llm_engine.engine import ChatMessage, FinishEvent, GenerateRequest, SamplingParams

    question = "Tell me three things to see in Paris, one sentence each, and why each is worth the trip."
    messages = (ChatMessage("system", cfg.persona(None).system_prompt), ChatMessage("user", question))
    finish = _run_alone(runtime.engine, GenerateRequest(CALIBRATE_SESSION, messages, SamplingParams(max_new_tokens=24)))
    if not isinstance(finish, FinishEvent) or finish.timings.decode_tokens == 0 or finish.timings.prefill_tokens == 0:
        return None
    t = finish.timings
    turn_s = (TURN_PROMPT_TOKENS * t.prefill_ms / t.prefill_tokens + TURN_REPLY_TOKENS * t.decode_ms / t.decode_tokens) / 1000
    share = min(1.0, turn_s / TURN_PERIOD_S)
    log.info("engine: a talking session's turns take ~%.2f s of it every %.0f s (prefill %.1f ms, decode %.1f ms a "
             "token): %.0f%% of the engine until measured", turn_s, TURN_PERIOD_S, t.prefill_ms / t.prefill_tokens,
             t.decode_ms / t.decode_tokens, 100 * share)  # fmt: skip
    return share


CALIBRATE_SESSION = "__calibrate__"


def _run_alone(engine: Any, request: Any) -> Any:
    """A start-up request through the engine to its end, its slot freed after: -> its last event."""
    last = None
    for last in engine.submit(request):
        pass
    engine.release(request.session_id)
    return last


def warm_grammar(cfg: AppConfig, engine: Any, support: ToolSupport) -> None:
    """A persona offered tools, or one with memory (its facts are read under a grammar): the grammar library's view of
    the tokenizer is built now (~1 s on 2 cores), at load, off the event loop, so the first tool turn or read does not
    pay for it (LlmBridge.warm_grammar then finds it)."""
    if any(p.memory or offered_entries(p, support)[0] for p in cfg.persona_defs.values()):
        from llm_engine import constrain

        constrain.warm(engine.tokenizer)


def _remote(stage: object) -> bool:
    from voice.remote.client import RemoteSpec

    return isinstance(getattr(stage, "spec", None), RemoteSpec)


def load_and_warm(cfg: AppConfig, stages: Collection[str] = ALL_STAGES, *, sessions: bool = True) -> Runtime:
    """load() then warm() on a thread of their own that exits before this returns (their errors re-raised),
    so the engine thread's OpenMP pool is the only one while serving (see llm_engine.threads)."""
    from llm_engine.threads import on_own_thread

    def load_warmed() -> Runtime:
        runtime = load(cfg, stages=stages, sessions=sessions)
        warm(runtime)
        if sessions:
            pin_persona_prompt(runtime, cfg)
            runtime.engine_turn_share = calibrate_engine(runtime, cfg)
        return runtime

    return on_own_thread(load_warmed, name="parley-load")


def _warm_request() -> Any:
    from llm_engine.engine import ChatMessage, GenerateRequest, SamplingParams

    # the end-of-turn probe reads the vocabulary once: here, not in the first user's turn
    return GenerateRequest("__warmup__", (ChatMessage("user", "Hi"),), SamplingParams(max_new_tokens=2), probe_user_end=True)
