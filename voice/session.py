"""A connection's part of a conversation (voice.conversation, which outlives it): the user's turns and at most one
reply, over the conversation's persona and history.

Every decision about who holds the floor is made by voice.turntaking; this is the async shell that runs what it
asks for: the Listener hears, the Replies (voice.replies) speak, the History (voice.history) remembers. Knows
nothing of sockets, JSON or config files (parley.runtime builds its settings and stages). The wire protocol and
trace: docs/protocol.md.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from voice.audio import SAMPLE_RATE
from voice.echo import ServerEcho, aec_available
from voice.conversation import Conversation
from voice.first_phrase import FirstPhrases
from voice.frontend import FrontEnd
from voice.history import History
from voice.listener import Listener, Overloaded
from voice.llm_bridge import LlmFinish
from voice.outbox import Outbox
from voice.replies import PLAYED_SLACK_MS, LlmFailed, Replies
from voice.stages import PersonaSpec, SessionSettings, Stages
from voice.summary import Summariser
from voice.facts import FactStore
from voice.user_memory import UserMemory
from llm_engine.tool_format import ToolSpec
from voice.tool_turn import ahead_unfit, with_tools
from voice.trace import TurnTrace
from voice.turn_shell import TurnShell
from voice.turn_policy import TurnPolicy
from voice.turntaking import Action, TurnTaking
from voice.turntaking import Reply as ReplyTo

__all__ = ["InputError", "Session", "LlmFailed"]
log = logging.getLogger(__name__)


class InputError(Exception):
    """A command the session refuses (unknown persona, overloaded): becomes a non-fatal `error`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Session:
    def __init__(
        self,
        session_id: str,
        stages: Stages,
        settings: SessionSettings,
        personas: Mapping[str, PersonaSpec],
        persona: str,
        voice: str | None = None,
        *,
        outbox: Outbox | None = None,
        on_trace: Callable[[TurnTrace], None] = lambda trace: None,
        conversation: Conversation | None = None,
        user: str = "",
    ) -> None:
        """`conversation`: the one this connection carries on (its id, persona, voice and history win over
        `session_id`, `persona` and `voice`); None: a new one of its own, that ends with it. `user`: who the user
        is (an owner of facts in the conversation's store, for personas with memory); "" none."""
        settings = replace(settings, turns=self._usable(settings.turns, stages))
        if settings.turns.uses_audio and stages.turn_model is None:
            raise ValueError(f"turn detection {settings.turns.detection!r} needs the audio turn model")
        if conversation is None:
            memory = History(settings.history_chars, settings.history_messages)
            conversation = Conversation(session_id, memory, persona, voice)
        self.stages = stages
        self.settings = settings
        self.personas = personas
        self.persona_name, self.voice_override = self._check(conversation.persona, conversation.voice)
        self.conversation = conversation
        self.session_id = conversation.id  # the engine's slot, the scheduler, admission and spans are keyed by it
        self.outbox = outbox or Outbox()
        self.on_trace = on_trace
        self._log_tools()
        self.instructions: str | None = None  # replaces the persona's system prompt (the Realtime API's)
        self.auto_reply = True  # a voice turn that ends is answered; else it only joins the history (respond())
        self.speak = True  # replies are spoken; else text only
        self.client_tools: tuple[ToolSpec, ...] = ()  # tools the client runs (the Realtime API's session.tools)
        self.client_tool_choice: str | None = None  # auto | required | none | a name; None: the persona's
        self.memory = conversation.memory  # what the user said and heard
        self.turns = TurnTaking(self._spoken_in(settings.turns), settings.vad_threshold, conversation.last_turn + 1)
        self.listener = Listener(
            self.session_id, stages.make_vad, stages.transcriber, stages.llm, stages.turn_model,
            partial_interval_ms=settings.partial_interval_ms, min_speech_ms=settings.turns.min_speech_ms,
            runner=stages.runner, partial_busy_interval_ms=settings.partial_busy_interval_ms,
            busy=lambda: self.preempt.busy(), frontend=self._frontend(settings, stages),
        )  # fmt: skip
        self.replies = Replies(self)
        self.summary = Summariser(self.session_id, self.memory, stages.llm, self.spawn, self.system_prompt, on=settings.summarise_history)
        facts = conversation.store if isinstance(conversation.store, FactStore) else None
        self.user_memory = UserMemory(self.session_id, user, facts, stages.llm, changed=self._memory_changed)
        self.preempt = FirstPhrases(self, settings.preemptive_phrase, settings.preemptive_shed_wait_ms)
        self.shell = TurnShell(self)  # runs what turn-taking asks for (voice.turn_shell)
        self._bg: set[asyncio.Task[Any]] = set()
        self.task_group: asyncio.TaskGroup | None = None  # the session's tasks, while run() runs
        self._early: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]] = []
        self._warming: asyncio.Task[Any] | None = None  # the warm-up prefill in flight (rewarm)
        conversation.attach()  # last: a session that failed to build never carried it

    @property
    def state(self) -> str:
        """listening (the user speaks) | responding (a reply runs) | idle."""
        return self.turns.state

    # -- who speaks ----------------------------------------------------------------------------

    @staticmethod
    def _frontend(settings: SessionSettings, stages: Stages) -> FrontEnd:
        """The microphone's chain: our own voice taken out first (the server's echo canceller, when asked for), then
        the noise (audio.denoise)."""
        echo = ServerEcho() if settings.server_aec and aec_available() else None
        return FrontEnd([stages.make_denoiser()] if stages.make_denoiser is not None else [], echo=echo)

    @property
    def echo(self) -> ServerEcho | None:
        """The echo canceller the replies' audio is the far end of, if the front end has one."""
        return self.listener.frontend.echo

    @property
    def persona(self) -> PersonaSpec:
        return self.personas[self.persona_name]

    @property
    def history(self) -> tuple[tuple[str, str], ...]:
        """(role, content): what the user said and heard, oldest first."""
        return self.memory.messages

    @property
    def voice_name(self) -> str:
        return self.voice_override or self.persona.voice

    def _check(self, persona: str | None, voice: str | None) -> tuple[str, str | None]:
        name = persona or getattr(self, "persona_name", None) or next(iter(self.personas))
        if name not in self.personas:
            raise InputError("unknown_persona", f"unknown persona {name!r} (known: {', '.join(self.personas)})")
        if voice is not None and voice not in self.stages.voices:
            raise InputError("unknown_voice", f"unknown voice {voice!r} (known: {', '.join(self.stages.voices)})")
        return name, voice

    def _log_tools(self) -> None:
        """Once a session (and on a persona switch): the tools its replies are offered and why (parley.tool_offer)."""
        p = self.persona
        log.info("session %s: persona %s offers tools: %s (%s)", self.session_id, p.name,
                 ", ".join(t.spec.name for t in p.tools) or "none", p.tools_why or "as given")  # fmt: skip

    def update(self, persona: str | None = None, voice: str | None = None) -> None:
        """Switch persona and/or voice; takes effect from the next reply. A new persona drops a voice override
        and greets in its own voice, ending a reply still speaking first (as a barge-in would)."""
        name, checked_voice = self._check(persona, voice)
        if persona is not None and voice is None:
            checked_voice = None
        elif voice is None:
            checked_voice = self.voice_override
        switched = name != self.persona_name
        self.persona_name, self.voice_override = name, checked_voice
        if switched:
            self.turns.retune(self._spoken_in(self.settings.turns), self.settings.vad_threshold)
            self._log_tools()
        if switched and self.settings.warm_prompt:
            self.rewarm()
        if switched and self.persona.greeting and self.settings.greet:
            self.apply(self.turns.greet())

    # -- inputs from the socket layer ------------------------------------------------------------

    def push_audio(self, samples: np.ndarray, arrival_ns: int, rate: int = SAMPLE_RATE) -> None:
        """float32 [N] at the wire's `rate` as it arrived; `arrival_ns` is perf_counter_ns at receipt. The front end
        (voice.frontend) resamples it and counts its time."""
        try:
            self.listener.push(samples, arrival_ns, rate)
        except ValueError as exc:
            raise InputError("bad_audio", str(exc)) from None
        except Overloaded:
            raise InputError("overloaded", "audio is arriving faster than it can be processed; dropped") from None

    def hear_now(self, samples: np.ndarray, rate: int) -> np.ndarray:
        """Audio no turn-taking listens to (a client that commits its own turns) through the same front end, here
        and now: -> what the recogniser should hear of it (16 kHz)."""
        front = self.listener.frontend
        try:
            front.receive(samples, rate)
        except ValueError as exc:
            raise InputError("bad_audio", str(exc)) from None
        return front.run(samples, rate)

    def text_input(self, text: str) -> int:
        """A typed user turn: skips VAD and ASR. Returns its turn id."""
        actions = self.turns.typed(text)
        turn_id = next(a.turn_id for a in actions if isinstance(a, ReplyTo))
        trace = self.new_trace(turn_id, "text")
        trace.mark("endpoint")
        self.apply(actions, typed=trace)
        return turn_id

    def add_user(self, text: str) -> None:
        """A user message into the history without a reply (the Realtime API's items; respond() answers it)."""
        self.memory.add_user(text)
        self.memory.trim()

    def add_message(self, role: str, content: str) -> None:
        """Another message a client puts in the history (the Realtime API's assistant items, its tools' outputs)."""
        self.memory.add(role, content)
        self.memory.trim()

    def respond(self) -> int:
        """Answer the history's last message, a user's or a tool result. -> the reply's turn id."""
        if self.history and self.history[-1][0] == "tool":  # a client's tool result: the reply goes on from it
            actions = [replace(a, kind="continue") if isinstance(a, ReplyTo) else a for a in self.turns.typed("")]
            turn_id = next(a.turn_id for a in actions if isinstance(a, ReplyTo))
            trace = self.new_trace(turn_id, "text")
            trace.mark("endpoint")
            self.apply(actions, typed=trace)
            return turn_id
        if not self.history or self.history[-1][0] != "user":
            raise InputError("no_input", "nothing to answer: the conversation does not end with a user message")
        return self.text_input(self.memory.pop_last()[1])

    def truncate(self, turn_id: int, heard_ms: float) -> str:
        """The history keeps only the words of a recent reply's first `heard_ms` (the Realtime API's truncate,
        from a client that knows what it played). -> what is kept."""
        running = self.replies.running(turn_id)
        if running is not None:
            running.played_ms = heard_ms  # still ending (a barge-in races the client's truncate): it keeps this much
            return running.spoken(heard_ms)
        try:
            return self.memory.truncate(turn_id, heard_ms, self.speak, PLAYED_SLACK_MS)
        except ValueError as exc:
            raise InputError("invalid_message", f"truncate: {exc}") from None

    def retune(self, turns: TurnPolicy, vad_threshold: float) -> None:
        """Another turn policy from the next turn on (the Realtime API's turn_detection)."""
        turns = self._usable(turns, self.stages)
        self.settings = replace(self.settings, turns=turns, vad_threshold=vad_threshold)
        self.turns.retune(self._spoken_in(turns), vad_threshold)

    def _spoken_in(self, turns: TurnPolicy) -> TurnPolicy:
        """`turns` with the persona's own words for interruptions, if it has them (its language)."""
        lexicon = self.persona.lexicon
        return turns if lexicon is None else replace(turns, lexicon=lexicon)

    @staticmethod
    def _usable(turns: TurnPolicy, stages: Stages) -> TurnPolicy:
        """`turns` as these stages can run it: the text signal read at its own LLM's even odds; a remote LLM gives
        none to wait for."""
        if not stages.llm.probes_user_end:
            return turns.without_text()
        return replace(turns, text_even_odds=stages.llm.text_even_odds)

    def cancel_reply(self) -> None:
        self.apply(self.turns.cancel())

    def playback_mark(self, turn_id: int, played_ms: float, arrival_ns: int, paused: bool = False) -> None:
        if turn_id > self.turns.last_turn:
            raise InputError("invalid_message", f"playback.mark: turn {turn_id} has not begun")
        wrong = self.replies.check_mark(turn_id, played_ms)
        if wrong is not None:
            raise InputError("invalid_message", f"playback.mark: {wrong}")
        self.replies.played(turn_id, played_ms, arrival_ns)
        echo, playing = self.echo, self.replies.audible(turn_id)
        if echo is not None and playing is not None:  # what plays, for the echo canceller (a reply sent whole too)
            echo.paused(turn_id, played_ms) if paused else echo.played(turn_id, played_ms, self.listener.frontend.received_ms)
        self.apply(self.turns.played(turn_id, played_ms, None if paused else self.replies.unplayed_after(turn_id, played_ms)))

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Listen until cancelled; replies and the work on each turn run beside the listen loop."""
        async with asyncio.TaskGroup() as tg:
            self.task_group = tg
            await self.user_memory.load()  # before the first prompt: what it remembers of the user is in it
            if self.settings.warm_prompt:
                self.rewarm()
            if self.persona.greeting and self.settings.greet:
                self.apply(self.turns.greet())
            early, self._early = self._early, []
            for fn, args in early:
                self.spawn(fn, *args)
            vad = await self.listener.start()
            self.turns.listen(vad.frame_ms, float(vad.end_lag_ms))
            async for frame in self.listener.frames():
                self.apply(self.turns.frame(frame.prob, frame.t_ms))
                if self.listener.feed(frame.samples):
                    utt = self.listener.utt
                    assert utt is not None
                    utt.partial_task = self.spawn(self.shell.partial, utt)

    async def close(self, keep: bool = False) -> None:
        """Stop everything this session started, wait for it, and detach from the conversation; `keep`: the
        conversation goes on (another connection may carry it: its engine slot stays), else its slot is freed."""
        self.replies.stop_current()
        self.preempt.close()
        self._early.clear()
        await self.user_memory.settle()
        tasks = [t for t in [*self._bg, self.replies.task] if t is not None]
        for task in tasks:
            task.cancel()
        pending = [t for t in tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        self.replies.close()
        self.conversation.detach(self.persona_name, self.voice_override, self.turns.last_turn)
        await asyncio.to_thread(self.stages.llm.release, self.summary.key)  # its side slot (the next prompt's keys)
        if not keep:
            await asyncio.to_thread(self.stages.llm.release, self.session_id)

    async def reply_finished(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the reply being spoken to end by itself."""
        await self.replies.finished(timeout_s)

    def reply_done(self, turn_id: int) -> None:
        """A reply ended (voice.replies): the voice turn it answered can no longer be joined by a continuation."""
        if self.shell.ended is not None and self.shell.ended.turn_id == turn_id:
            self.shell.ended = None

    def new_trace(self, turn_id: int, kind: str) -> TurnTrace:
        self.conversation.turned(turn_id, self.persona_name, self.voice_override)  # saved: a restart goes on from it
        trace = TurnTrace(turn_id, self.session_id, dict(self.settings.budgets_ms))
        trace.info.update(input=kind, persona=self.persona_name, voice=self.voice_name)
        if kind == "voice" and (denoise := self.listener.frontend.stage_delay_ms("denoise")) is not None:
            trace.info["denoise_ms"] = round(denoise, 3)  # what noise suppression held the microphone back
        return trace

    def messages(self, user_text: str | None = None, joins: int | None = None) -> list[tuple[str, str]]:
        """The prompt: system, history, the user's text. `joins`: the turn this one continues, whose exchange
        (its user message, and what was heard of its reply) the joined request replaces."""
        return self.memory.prompt(self.system_prompt(), user_text, joins)

    def system_prompt(self) -> str:  # the persona's (or client's) instructions, what it remembers of the user, tools
        llm = self.stages.llm
        system = self.instructions or self.persona.system_prompt
        if self.persona.memory and (remembered := self.user_memory.prompt()):
            system = f"{system}\n\n{remembered}"
        return with_tools(system, self.persona, self.client_tools, self.client_tool_choice,
                          native=llm.native_tools, wording=lambda text, tools: llm.system_with_tools(text, tools))  # fmt: skip

    def tools_unfit_ahead(self) -> str | None:
        """Why a reply's first phrase may not be made in the pause, for its tools (voice.tool_turn.ahead_unfit)."""
        native = self.stages.llm.native_tools
        return ahead_unfit(self.persona, self.client_tools, self.client_tool_choice, native)

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> asyncio.Task[Any] | None:
        """Run `fn(*args)` as background work of this session. The coroutine is made inside the task, so a
        task cancelled before it starts leaves no coroutine behind un-awaited."""
        if self.task_group is None:  # a command that came before run() got going: started by run()
            self._early.append((fn, args))
            return None
        guarded = self._guard(fn, args)
        try:
            task = self.task_group.create_task(guarded)
        except RuntimeError:  # the group is finishing (the session closes): nothing starts, nothing left un-awaited
            guarded.close()
            raise
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        return task

    async def _guard(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        """Background work (partials, recognition, checks, turn start) fails alone, with an error to the client."""
        try:
            await fn(*args)
        except (LlmFailed, OSError, RuntimeError, ValueError) as exc:
            log.warning("session %s: %r", self.session_id, exc)
            self.outbox.send("error", code="stage_failed", message=str(exc), fatal=False)

    def apply(self, actions: Sequence[Action], typed: TurnTrace | None = None) -> None:
        """Run what turn-taking asked for (voice.turn_shell; also called by voice.replies as replies end)."""
        self.shell.apply(actions, typed)

    def _memory_changed(self) -> None:  # a fact the user asked to forget left the system prompt: into the cache now
        if self.settings.warm_prompt and self.task_group is not None:
            with suppress(RuntimeError):  # the session is closing: its next conversation's prompt has it right
                self.rewarm()

    def rewarm(self) -> None:
        """warm_prompt for the prompt as it is now, superseding one not finished yet (its queued prefill is
        cancelled): one warm-up a session at most, however fast turns come (a flood of typed messages, each
        dropping history, once queued a prefill each: minutes of engine work every other session waited behind)."""
        if self._warming is not None:
            self._warming.cancel()
        self._warming = self.spawn(self.warm_prompt)

    async def warm_prompt(self) -> None:
        """The prompt so far (the system prompt, and the history once some was dropped) into this session's
        cache while the user speaks, not after they finish (~50 tokens ~80 ms here; ~700 tokens ~1.1 s)."""
        done = await self.stages.llm.prefill(self.session_id, self.messages())
        if isinstance(done, LlmFinish):  # copied from another session's slot: the next reply's trace says so
            self.replies.warm_shared += done.shared_prefix_tokens
