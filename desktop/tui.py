"""What the terminal shows: state, live transcript, reply text, and the per-turn latency table (rich).

`ClientView` is the plain state the client updates; the render functions turn it into rich
renderables. Knows nothing of audio or sockets.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from desktop.latency import TurnLatency

STAGE_COLUMNS = ("endpointing", "asr", "llm_ttft", "phrase", "tts", "send", "voice_to_voice")
SHORT = {"endpointing": "endpt", "llm_ttft": "ttft", "voice_to_voice": "v2v"}  # fits 80 columns


@dataclass
class ClientView:
    state: str = "connecting"  # connecting | idle | listening | thinking | speaking | reconnecting | closed
    server: str = ""
    persona: str = ""
    voice: str = ""
    echo_mode: str = ""
    push_to_talk: bool = False
    talking: bool = False
    partial: str = ""  # live transcript of what the user is saying
    user_text: str = ""  # last final transcript
    reply: str = ""
    notice: str = ""  # last error or hint, one line
    turns: list[TurnLatency] = field(default_factory=list)
    budgets_ms: dict[str, float] = field(default_factory=dict)


def _ms(value: float | None, budget: float | None = None) -> Text:
    if value is None:
        return Text("—", style="dim")
    over = budget is not None and value > budget
    return Text(f"{value:.0f}", style="bold red" if over else "")


def latency_table(turns: list[TurnLatency], budgets_ms: dict[str, float], last: int = 8) -> Table:
    """One row per turn: the server's stages, mic-to-ear measured here, red where over budget."""
    table = Table(title="latency per turn (ms)", title_justify="left", expand=False, box=box.SIMPLE_HEAD,
                  padding=(0, 1, 0, 0), pad_edge=False,
                  caption="server stages; v2v = voice_to_voice; mic→ear and play (first audio in to first sample at the "
                          "speaker) measured by this client; red = over budget",
                  caption_justify="left")
    table.add_column("turn", justify="right", no_wrap=True)
    table.add_column("you said", max_width=14, overflow="ellipsis", no_wrap=True)
    for stage in STAGE_COLUMNS:
        budget = budgets_ms.get(stage)
        name = SHORT.get(stage, stage)
        table.add_column(name if budget is None else f"{name}\n≤{budget:.0f}", justify="right", no_wrap=True,
                         min_width=max(len(name), 5))
    table.add_column("mic→ear", justify="right", no_wrap=True, min_width=7)
    table.add_column("play", justify="right", no_wrap=True, min_width=4)
    for row in turns[-last:]:
        label = (row.user_text or "(greeting)") + (" (interrupted)" if row.interrupted else "")
        cells = [_ms(row.stages_ms.get(s), budgets_ms.get(s)) for s in STAGE_COLUMNS]
        table.add_row(str(row.turn_id), label, *cells, _ms(row.mic_to_ear_ms), _ms(row.client_playback_ms))
    return table


def render(view: ClientView) -> Group:
    mode = "push-to-talk (space: talk/stop)" if view.push_to_talk else "hands-free"
    talk = " [bold green]● talking[/]" if view.push_to_talk and view.talking else ""
    head = (f"[bold]{view.state}[/]{talk}   server {view.server}   persona [cyan]{view.persona}[/]   "
            f"voice {view.voice}   echo {view.echo_mode}   {mode}")
    convo = Text()
    convo.append("you: ", style="bold")
    convo.append(view.partial or view.user_text, style="italic" if view.partial else "")
    convo.append("\nparley: ", style="bold")
    convo.append(view.reply)
    parts: list[object] = [Text.from_markup(head), Panel(convo), latency_table(view.turns, view.budgets_ms)]
    if view.notice:
        parts.append(Text(view.notice, style="yellow"))
    parts.append(Text("keys: p next persona · i interrupt · q quit" + (" · space talk" if view.push_to_talk else ""),
                      style="dim"))
    return Group(*parts)  # type: ignore[arg-type]


def print_latency(console: Console, view: ClientView) -> None:
    console.print(latency_table(view.turns, view.budgets_ms, last=1000))
