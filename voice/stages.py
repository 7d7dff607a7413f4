"""What a session is made of: the loaded stages every session shares, the settings from the config, a persona.

Frozen values built once by parley.runtime and handed to each Session; no behaviour here.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from voice.asr import Transcriber
from voice.frontend import AudioStage
from voice.interjection import Lexicon
from voice.llm_stage import LlmStage
from voice.phrase_audio import PhraseAudioCache
from voice.reply import VoiceBinding, WorkCounter
from voice.scheduler import DirectRunner, StageRunner
from voice.smart_turn import TurnModel
from voice.tool_registry import Tool, ToolBox
from voice.turn_policy import TurnPolicy
from voice.vad import Vad


@dataclass(frozen=True)
class PersonaSpec:
    name: str
    system_prompt: str
    voice: str
    greeting: str | None = None
    speaking_rate: float = 1.0
    max_reply_tokens: int = 120
    temperature: float = 0.0
    tools: tuple[Tool, ...] = ()  # server-side tools its replies may call (voice.tool_turn)
    tool_choice: str = "auto"  # auto | required | none | a tool's name (that tool, every reply)
    tool_filler: str = "One moment."  # said while a tool takes longer than voice.tool_turn.FILLER_AFTER_S
    tools_why: str = ""  # why these tools (parley.tool_offer): logged once a session
    lexicon: Lexicon | None = None  # the words that decide an interruption, when not the turn policy's
    memory: bool = False  # remembers facts its user states, across conversations (voice.user_memory)

    @property
    def toolbox(self) -> ToolBox:
        return ToolBox(self.tools)


@dataclass(frozen=True)
class SessionSettings:
    turns: TurnPolicy = field(default_factory=TurnPolicy)
    vad_threshold: float = 0.5
    partial_interval_ms: int = 500
    partial_busy_interval_ms: int = 0  # while voice.first_phrase's busy() says the machine cannot spare it (0: off)
    budgets_ms: Mapping[str, float] = field(default_factory=dict)
    output_sample_rate: int = 22050
    audio_lead_ms: float = 1000.0
    greet: bool = True  # speak the persona's greeting at start and on a persona switch
    warm_prompt: bool = True  # prefill the persona's system prompt at start and on a persona switch
    history_chars: int = 5000  # the history a prompt carries; past it the oldest half goes at once (parley.runtime)
    history_messages: int = 200  # and past this many messages (tiny ones cost the chat template a render each)
    summarise_history: bool = True  # the oldest turns summarised ahead of the bound instead of dropped (voice.summary)
    server_aec: bool = False  # cancel the replies' echo in the microphone on the server (voice.echo)
    preemptive_phrase: bool = False  # the reply's first phrase made in the user's pause (voice.first_phrase)
    preemptive_shed_wait_ms: float = 50.0  # shed it while what users wait for queues longer than this (p95)
    warm_partials: bool = False  # prefill each partial's prompt while the user speaks (voice.listener.warm)
    audio_check_ahead: bool = False  # the check's audio model run at the pause, beside the final recognition


@dataclass(frozen=True)
class Stages:
    """The loaded models a session uses; built once per server and shared by all sessions."""

    make_vad: Callable[[], Vad]  # VADs keep per-stream state: one per session
    transcriber: Transcriber
    llm: LlmStage  # voice.llm_bridge.LlmBridge over our engine, or voice.remote.llm.RemoteLlm
    voices: Mapping[str, VoiceBinding]
    turn_model: TurnModel | None = None  # the audio end-of-turn model, for smart_turn / combined detection
    make_denoiser: Callable[[], AudioStage] | None = None  # noise suppression (voice.denoise): one per session
    tts_work: WorkCounter = field(default_factory=WorkCounter)
    runner: StageRunner = field(default_factory=DirectRunner)  # where recognition, synthesis and turn checks run
    phrase_audio: PhraseAudioCache = field(default_factory=PhraseAudioCache)  # greetings' audio, made once a voice
