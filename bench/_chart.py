"""The e2e chart: one horizontal waterfall per turn (stages from the last voiced sample to the first reply
audio sent, budgets marked) and per-stage median/p95 against budgets. Matplotlib only, headless.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench._client import TurnResult

# pipeline order on the server clock: each segment runs from one mark to the next
SEGMENTS = (
    ("endpointing", "speech_end", "endpoint"),
    ("asr", "endpoint", "asr_final"),
    ("llm_ttft", "asr_final", "llm_first_token"),
    ("phrase", "llm_first_token", "first_phrase"),
    ("tts", "first_phrase", "tts_first_audio"),
    ("send", "tts_first_audio", "first_audio_sent"),
)
COLOURS = {"endpointing": "#9e9e9e", "asr": "#4e79a7", "llm_ttft": "#f28e2b", "phrase": "#e15759",
           "tts": "#59a14f", "send": "#b07aa1"}


def waterfall(marks_ms: Mapping[str, float]) -> list[tuple[str, float, float]]:
    """(stage, start_ms, width_ms) after speech_end; a mark that came early (ASR ahead of the endpoint,
    prefill before the final) is clamped to the previous one so segments never overlap or go backwards."""
    if "speech_end" not in marks_ms:
        return []
    t0 = marks_ms["speech_end"]
    out: list[tuple[str, float, float]] = []
    cursor = 0.0
    for stage, _a, b in SEGMENTS:
        if b not in marks_ms:
            continue
        end = max(cursor, marks_ms[b] - t0)
        out.append((stage, cursor, end - cursor))
        cursor = end
    return out


def draw(turns: Sequence[TurnResult], summary: Mapping[str, Mapping[str, Any]], budgets_ms: Mapping[str, float],
         path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traced = [t for t in turns if t.trace is not None]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 3 + 0.32 * len(traced) + 3),
                                   gridspec_kw={"height_ratios": [max(len(traced), 2), 6]})
    for y, t in enumerate(traced):
        assert t.trace is not None
        for stage, start, width in waterfall(t.trace.get("marks_ms", {})):
            ax1.barh(y, width, left=start, color=COLOURS[stage], height=0.7)
        if t.client_v2v_ms is not None:
            ax1.plot(t.client_v2v_ms, y, marker="|", color="black", markersize=12, mew=2)
    if "voice_to_voice" in budgets_ms:
        ax1.axvline(budgets_ms["voice_to_voice"], color="red", linestyle="--", label="voice_to_voice budget")
    ax1.set_yticks(range(len(traced)), [f"{t.index + 1} {t.voice}" for t in traced], fontsize=7)
    ax1.invert_yaxis()
    ax1.set_xlabel("ms after the last voiced sample (server clock); | = client-side first audio")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax1.legend(handles + ax1.get_legend_handles_labels()[0], [*COLOURS, "voice_to_voice budget"],
               fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax1.set_title(title, fontsize=10)

    names = [s for s in (*COLOURS, "voice_to_voice", "client_v2v") if summary.get(s, {}).get("n")]
    xs = range(len(names))
    ax2.bar([x - 0.2 for x in xs], [summary[s]["median"] for s in names], width=0.4, label="median", color="#4e79a7")
    ax2.bar([x + 0.2 for x in xs], [summary[s]["p95"] for s in names], width=0.4, label="p95", color="#f28e2b")
    for x, s in zip(xs, names):
        budget = summary[s].get("budget")
        if budget is not None:
            ax2.hlines(budget, x - 0.45, x + 0.45, color="red", linestyle="--")
    ax2.set_xticks(list(xs), names, fontsize=8)
    ax2.set_ylabel("ms")
    ax2.legend(fontsize=8, title="red dashes: budget", title_fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
