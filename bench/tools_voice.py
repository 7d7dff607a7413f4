"""bench.tools' voice part: spoken "what time is it?" turns to a real `parley serve` whose persona forces the time
tool, and each turn's voice-to-voice and `tool` stage from its trace. The embedded models do not choose a tool by
themselves in a conversation (docs/tools.md), so the persona sets `tool_choice: current_time`; the call, the tool run
and the answer are still the model's and the tool's own (the default 0.5B writes another call where the answer
belongs, so the tool's result is said).
"""
from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench._client import ScriptedSession, TurnResult
from bench._prompts import VOICES, spoken
from bench._server import start_server
from bench._stats import percentile
from parley.config import DEFAULT_CONFIG

QUESTIONS = ("What time is it?", "What's the time right now?", "Can you tell me the current time?")
PERSONA = "clock"


def clock_persona(folder: Path) -> None:
    """The shipped assistant persona with the shipped tools offered and the time tool forced (its replies kept short:
    voice-to-voice is the first audio, the rest only lengthens the run)."""
    shipped = yaml.safe_load((DEFAULT_CONFIG.parent / "personas" / "assistant.yaml").read_text())
    persona = {**shipped, "tools": ["default"], "tool_choice": "current_time", "max_reply_tokens": 40}
    (folder / f"{PERSONA}.yaml").write_text(yaml.safe_dump(persona))


def summary(turns: list[TurnResult]) -> dict[str, Any]:
    """turns, the traced ones that ran the time tool, voice-to-voice median / p95 and the tool stage's median."""
    traced = [t.trace for t in turns if t.trace is not None]
    called = [tr for tr in traced if any(x.get("name") == "current_time" and x.get("ok") for x in tr.get("tools", []))]
    v2v = [float(tr["stages_ms"]["voice_to_voice"]) for tr in called if "voice_to_voice" in tr.get("stages_ms", {})]
    tool = [float(tr["stages_ms"]["tool"]) for tr in called if "tool" in tr.get("stages_ms", {})]
    client = [t.client_v2v_ms for t in turns if t.client_v2v_ms is not None]
    return {"turns": len(turns), "tool_turns": len(called), "errors": [t.error for t in turns if t.error],
            "v2v_median": statistics.median(v2v) if v2v else None, "v2v_p95": percentile(v2v, 95) if v2v else None,
            "client_v2v_median": statistics.median(client) if client else None,
            "tool_ms_median": statistics.median(tool) if tool else None, "tool_ms_max": max(tool, default=None),
            "replies": [t.reply for t in turns]}  # fmt: skip


def voice_tool_turns(n: int, server: str | None = None, token: str | None = None) -> dict[str, Any]:
    """`n` spoken time questions (Piper and flite in turn) in one session; a server of its own unless `server` is
    given (then its persona named `clock` must force the time tool, as clock_persona writes it)."""
    prompts = [spoken(QUESTIONS[i % len(QUESTIONS)], VOICES[i % len(VOICES)]) for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        folder = Path(tmp)
        proc = None
        if server is None:
            clock_persona(folder)
            sets = (f"personas_dir={folder}", f"personas=[{PERSONA}]", f"default_persona={PERSONA}")
            proc = start_server(folder / "traces.jsonl", folder / "server.log", sets=sets)
            server = proc.url
        try:
            session = ScriptedSession(server, token=token, persona=PERSONA, turn_timeout_s=90.0)
            return summary(asyncio.run(session.run(prompts)))
        finally:
            if proc is not None:
                proc.stop()


def format_row(r: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    return (f"\nVoice-to-voice with a tool call in the turn (a real parley serve, embedded models; the default model does "
            f"not choose tools on its own in a conversation, so the persona forces current_time with tool_choice):\n"
            f"{'turns':>6}{'tool turns':>12}{'v2v median ms':>15}{'v2v p95 ms':>12}{'client v2v median':>19}"
            f"{'tool ms median':>16}{'tool ms max':>13}\n"
            f"{r['turns']:>6}{r['tool_turns']:>12}{ms(r['v2v_median']):>15}{ms(r['v2v_p95']):>12}"
            f"{ms(r['client_v2v_median']):>19}{r['tool_ms_median'] or 0:>16.1f}{r['tool_ms_max'] or 0:>13.1f}"
            + (f"\nerrors: {r['errors']}" if r["errors"] else ""))  # fmt: skip
