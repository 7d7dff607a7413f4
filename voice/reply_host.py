"""What a session's replies (voice.replies) use of the session they belong to: its state and the few calls back.

voice.session's Session is one. The replies know it by this shape alone, so voice.session imports voice.replies
and not the other way round."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from llm_engine.tool_format import ToolSpec
from voice.echo import ServerEcho
from voice.first_phrase import FirstPhrases
from voice.history import History
from voice.outbox import Outbox
from voice.stages import PersonaSpec, SessionSettings, Stages
from voice.summary import Summariser
from voice.user_memory import UserMemory
from voice.trace import TurnTrace
from voice.turntaking import Action, TurnTaking


class ReplyHost(Protocol):
    session_id: str
    stages: Stages
    settings: SessionSettings
    outbox: Outbox
    memory: History  # what the user said and heard
    turns: TurnTaking  # who holds the floor
    speak: bool  # replies are spoken; else text only
    task_group: asyncio.TaskGroup | None  # the session's tasks, while it runs
    on_trace: Callable[[TurnTrace], None]
    echo: ServerEcho | None  # the echo canceller the replies' audio is the far end of
    client_tools: tuple[ToolSpec, ...]  # tools the client runs (the Realtime API's session.tools)
    client_tool_choice: str | None  # the client's tool_choice (None: the persona's)
    preempt: FirstPhrases  # the reply's first phrase made in the user's pause, held for the endpoint
    summary: Summariser  # the oldest turns summarised ahead, put in place as a reply ends
    user_memory: UserMemory  # what it remembers of the user across conversations (a persona's memory: true)

    @property
    def persona(self) -> PersonaSpec: ...

    @property
    def history(self) -> list[tuple[str, str]]: ...

    @property
    def voice_name(self) -> str: ...

    def messages(self, user_text: str | None = None, joins: int | None = None) -> list[tuple[str, str]]:
        """The prompt: system, history, the user's text (`joins`: the turn this one continues)."""
        ...

    def apply(self, actions: Sequence[Action], typed: TurnTrace | None = None) -> None:
        """Run what turn-taking asked for (a reply that ends hands back the floor through this)."""
        ...

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> asyncio.Task[Any] | None:
        """Run `fn(*args)` as background work of the session."""
        ...

    def rewarm(self) -> None:
        """The prompt as it is now into the session's cache, superseding a warm-up not finished yet."""
        ...

    def reply_done(self, turn_id: int) -> None:
        """A reply ended: the voice turn it answered can no longer be joined by a continuation."""
        ...

    def tools_unfit_ahead(self) -> str | None:
        """Why a reply's first phrase may not be made in the pause, for its tools (None: it may)."""
        ...
