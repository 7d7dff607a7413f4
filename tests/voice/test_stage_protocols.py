"""The LLM stage's protocol (voice.llm_stage.LlmStage): both kinds answer every member, and nothing in voice/ or web/
probes the LLM stage, the recogniser, the stage runner or the VAD with getattr (issue 47: stages say what they offer)."""
from __future__ import annotations

import re
from pathlib import Path

from voice.llm_bridge import LlmBridge
from voice.llm_stage import LlmStage
from voice.remote.client import RemoteSpec
from voice.remote.llm import RemoteLlm

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = sorted({*LlmStage.__annotations__, *(n for n in vars(LlmStage) if not n.startswith("_"))})


def test_both_kinds_answer_every_member_of_the_protocol() -> None:
    assert {"probes_user_end", "native_tools", "local_cache", "text_even_odds", "other_requests"} <= set(MEMBERS)
    for kind in (LlmBridge, RemoteLlm):
        missing = [m for m in MEMBERS if not hasattr(kind, m)]
        assert not missing, f"{kind.__name__} lacks {missing}"
    remote = RemoteLlm(RemoteSpec("http://127.0.0.1:9/v1", model="m"))
    assert (remote.probes_user_end, remote.native_tools, remote.local_cache) == (False, True, False)
    assert remote.other_requests("s") == 0 and remote.prefix_cache_counts() == (0, 0)
    assert remote.busy_seconds() == (0.0, {}) and remote.decode_path is None


def test_both_runners_answer_what_admission_and_metrics_read() -> None:
    from voice.scheduler import DirectRunner, StageScheduler
    from voice.stage_queue import Policy

    direct, scheduler = DirectRunner(), StageScheduler(Policy(workers=2, partial_workers=1, background_workers=1))
    try:
        for runner in (direct, scheduler):
            runner.forget_key("s")
            assert runner.busy_s == {} and runner.stage_busy_s == {}
        assert direct.stats is None and scheduler.stats is not None
    finally:
        scheduler.close()


def test_nothing_probes_the_llm_stage_the_recogniser_the_runner_or_the_vad_with_getattr() -> None:
    """Nor the engine, outside voice/llm_bridge.py (the one place that reaches it: busy time, decode path, counters)."""
    probe = re.compile(r"getattr\([^,)]*(llm|runner|vad|transcriber|engine)\b")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for folder in ("voice", "web") for path in sorted((ROOT / folder).rglob("*.py")) if path.name != "llm_bridge.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if probe.search(line)]  # fmt: skip
    assert not found, "\n".join(found)
