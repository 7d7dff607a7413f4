"""Both benchmarks in their tiny modes against one real server on the embedded models, as subprocesses, so
the scripts themselves keep working: two spoken prompts for e2e, two concurrent sessions for load."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.parley_process import ParleyProcess
from bench._stats import GAP_MS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", f"bench.{name}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def assert_two_turns(median: float, p95: float, v2v: dict) -> None:
    """A report's median and p95 of two turns: the median is their mean, the p95 lies 95 % of the way from the
    faster to the slower (the slower is the summary's max)."""
    fastest, slowest = 2 * v2v["median"] - v2v["max"], v2v["max"]
    assert v2v["n"] == 2 and median == v2v["median"] > 0 and 0 < fastest <= slowest, v2v
    assert p95 == pytest.approx(fastest + 0.95 * (slowest - fastest)), v2v


def test_e2e_tiny(real_server: ParleyProcess, tmp_path: Path) -> None:
    out, chart = tmp_path / "e2e.json", tmp_path / "e2e.png"
    proc = run_script("e2e", "--tiny", "--server", real_server.url, "--out", str(out), "--chart", str(chart))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    turns = result["turns"]
    assert [t["voice"] for t in turns] == ["piper", "flite"]
    assert all(t["error"] is None and t["trace"] is not None for t in turns)
    for t in turns:
        marks = t["trace"]["marks_ms"]
        assert marks["speech_end"] <= marks["endpoint"] <= marks["first_audio_sent"]
        assert t["client_v2v_ms"] > 0
    assert len({t["turn_id"] for t in turns}) == 2
    assert result["summary"]["voice_to_voice"]["n"] == 2 and result["summary"]["client_v2v"]["n"] == 2
    assert result["wer"] is not None and result["wer"] <= 0.3  # tiny.en hears Piper and flite nearly perfectly
    assert result["budgets_ms"]["voice_to_voice"] > 0
    assert chart.read_bytes()[:4] == b"\x89PNG"
    assert "voice_to_voice" in proc.stdout and "Transcript WER" in proc.stdout
    pre = result["preemptive"]  # the shipped config makes the first phrase in the pause: every voice turn says how it went
    assert pre["turns"] == 2 == sum(pre[o] for o in ("hit", "miss", "shed", "dropped")), pre
    assert [t["trace"]["preemptive"] for t in turns].count("hit") == pre["hit"] and "Preemptive first phrase" in proc.stdout


def test_load_tiny_scheduling_before_and_after(real_server: ParleyProcess, tmp_path: Path) -> None:
    """load --tiny's level against a server scheduling its stages as before (each on a thread at once, started for the
    run) and against the shared server (the shared scheduler, as shipped): both answer, the table puts them side by
    side, and the shipped side's level is reported in full."""
    out = tmp_path / "load.json"
    proc = run_script("load", "--tiny", "--scheduling", "both", "--server", real_server.url, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for name in ("before", "after"):
        (level,) = result["topologies"][name]
        assert level["sessions"] == 2 and level["turns"] == 2 and level["errors"] == 0, (name, level["error_list"])
    before, after = result["topologies"]["before"][0]["queue_ms"], result["topologies"]["after"][0]["queue_ms"]
    assert before["asr"]["p95"] == 0.0  # nothing queues when each job has its own thread
    assert result["topologies"]["before"][0]["partials_run"] is None  # no shared scheduler to count them
    assert "Before (each stage on its own thread at once) vs after" in proc.stdout
    (level,) = result["levels"]  # the shipped scheduling's level, as load --tiny alone reports it
    assert level == result["topologies"]["after"][0]
    assert_two_turns(level["v2v_median"], level["v2v_p95"], level["summary"]["voice_to_voice"])
    assert level["rss_mb_max"] > 100  # the server with its models loaded, found by its port
    assert level["holds"] == (level["v2v_p95"] <= result["budgets_ms"]["voice_to_voice"])
    assert result["max_sessions_within_budget"] == (2 if level["holds"] else 0)
    assert level["refused"] == 0 and after["asr"]["n"] == 2  # each turn's final says how long it queued
    assert level["partials_run"] + level["partials_skipped"] > 0  # from /metrics: the speakers' partials, counted
    gaps = level["reply_gaps"]  # how long the replies' speech stalled, as the client played it
    # a reply counts as stalled when its longest silence reached the bench's GAP_MS: some did exactly when the
    # longest of all did
    assert gaps["stalled"] in (0, 1, 2) and (gaps["stalled"] > 0) == (gaps["max_ms"] >= GAP_MS), gaps
    assert all(column in proc.stdout for column in ("Concurrent sessions", "partials run/dropped", "stalled replies"))
    pre = level["preemptive"]  # hit, missed, shed for load or dropped: each turn is one of them
    assert pre["turns"] == 2 == sum(pre[o] for o in ("hit", "miss", "shed", "dropped")), pre


def test_load_tiny_split_topology(tmp_path: Path) -> None:
    """Two front ends whose stages are a `parley stages` process: the sessions are answered, dealt over both."""
    out = tmp_path / "load.json"
    proc = run_script("load", "--tiny", "--topology", "split", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (level,) = result["topologies"]["split"]
    assert level["sessions"] == 2 and level["turns"] == 2 and level["errors"] == 0, level["error_list"]
    assert level["v2v_median"] > 0 and level["rss_mb_max"] > 100  # three processes sampled
    assert "2 front ends" in proc.stdout


def test_llm_table_tiny() -> None:
    """bench/llm.py with a few tokens and no baselines: every variant's rows (torch eager, compiled step,
    speculative), the batching rows, the persona table (cold vs prefix hit) and the real Gemma 3 270M's row."""
    proc = run_script("llm", "--tokens", "6", "--batch-tokens", "3", "--batches", "1,2", "--contexts", "20,60", "--context-steps", "4",
                      "--kv-contexts", "20,60", "--grammar-rounds", "1",
                      "--skip-transformers", "--skip-llama-cpp", "--persona-sessions", "1", "--gemma3", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for variant in ("none (fp32)", "int8", "int4 (Q4_1 blocks)"):
        for path in ("torch eager", "compiled step"):
            plain = [line for line in lines if line.startswith(f"{variant}, {path} ")]
            assert len(plain) == 1, (variant, path, lines)
            assert float(plain[0].split()[-4]) > 0  # tokens/s
        spec = [line for line in lines if line.startswith(variant + " + speculation")]
        assert len(spec) == 1, (variant, lines)
    compiled = [line for line in lines if "compiled step:" in line and "concurrent requests" in line]
    assert len(compiled) == 4  # none and int4 at 1 and 2
    assert sum("torch:" in line and "concurrent requests" in line for line in lines) == 2  # int4 at 1 and 2
    assert any(line.startswith("llama.cpp") and "skipped" in line for line in lines)
    at = lines.index(next(line for line in lines if "cached positions" in line))
    assert lines[at + 1].split() == ["20", "60"]
    for row, cache in ((lines[at + 2], "float32 KV cache"), (lines[at + 3], "float16 KV cache")):
        assert cache in row and all(float(r) > 0 for r in row.split()[-2:]), row
    kv = {name: next(line for line in lines if line.startswith(f"ours, {name} KV cache ")).split()[-4:] for name in ("float16", "int8")}
    assert all(float(v) > 0 for v in kv["float16"] + kv["int8"]), kv  # tok/s and MB per slot at 20 and 60 positions
    assert 0.5 < float(kv["int8"][1]) / float(kv["float16"][1]) < 0.6  # int8 codes + a float32 scale per 64 values
    for label, kernel in (("Gemma 3 270M Q4_K_M", "46 matrices; int4 "), ("SmolLM2-135M Q4_1 (embedded)", "int4 ")):
        row = next(line for line in lines if line.startswith(label))
        assert float(row[len(label) :].split()[1]) > 0 and kernel in row, row  # ours tok/s (median), its kernels
    grammar = next(line for line in lines if line.startswith("decode tok/s free"))  # bench.tools' mask cost
    free, guided = (float(grammar.split()[i].rstrip(",;")) for i in (3, 7))
    assert free > 0 and guided > 0 and "% of a decode step" in grammar, grammar
    cold = next(line for line in lines if line.startswith("off (cold prefill)")).split()
    hit = next(line for line in lines if line.startswith("on (copied from an idle slot)")).split()
    assert int(cold[-1]) == 0 and int(hit[-1]) > 150  # the persona prompt copied, not computed
    assert int(hit[-2]) < int(cold[-2]) - 150 and cold[-3] == hit[-3]  # computed tokens; the same prompt


def test_thinking_tiny() -> None:
    """bench/thinking.py on two thinking phrases and two requests in Piper's voice: a row each, and the summary."""
    proc = run_script("thinking", "--tiny")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "| piper |" in line]
    assert len(rows) == 4 and all(row.split("|")[4].strip() in ("yes", "no") for row in rows), rows
    assert "requests read as requests: 2 of 2" in proc.stdout  # a request is never met with silence


def test_turns_tiny(tmp_path: Path) -> None:
    """bench/turns.py on two paused and two whole requests: one row per detector, each clip accounted for."""
    out = tmp_path / "turns.json"
    proc = run_script("turns", "--tiny", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert list(result["detectors"]) == ["fixed", "smart_turn", "text", "combined"]
    for name, det in result["detectors"].items():
        assert (det["paused"], det["whole"]) == (2, 2) and len(det["clips"]) == 4
        assert det["split"] <= det["cut_early"] <= det["paused"]
        for clip in det["clips"]:
            assert clip["ends"] and all(e["reason"] in ("silence", "complete", "max_hangover") for e in clip["ends"])
            if name == "fixed":
                assert clip["delay_ms"] >= result["policy"]["hangover_ms"]  # audio time: no fixed endpoint comes sooner
            else:
                assert all(ch["decision"] in ("end", "wait", "stale", "unanswered") for e in clip["ends"] for ch in e["checks"])
    assert result["detectors"]["fixed"]["checks"] == 0 and result["detectors"]["text"]["checks"] > 0
    assert "End-of-turn detectors" in proc.stdout and "text probe: embedded, even odds" in proc.stdout  # the default's


def test_soak_tiny(real_server: ParleyProcess, tmp_path: Path) -> None:
    """bench/soak.py's smoke form against the shared server: a short conversation, two drops resumed, and a few
    connect cycles."""
    out = tmp_path / "soak.json"
    proc = run_script("soak", "--tiny", "--server", real_server.url, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [row[0] for row in result["conversation"]] == ["1-2", "3-4"]
    assert all(float(row[1]) > 0 for row in result["conversation"]) and result["cycle_ms"] > 0
    assert "connect/disconnect cycles" in proc.stdout
    assert result["drops"]["reconnects"] == result["drops"]["resumed"] == 2  # each cut socket carried it on
    assert result["recall"]["answer"]  # the last turn asked back what turn 3 said (whether right is the model's)


def test_voice_asr_batch_tiny() -> None:
    """bench/stages.py --asr-batch: the finals-batched-across-sessions table, one round of two."""
    proc = run_script("stages", "--asr-batch", "--tiny")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("2 ")]
    assert float(row[2]) > 0 and float(row[3]) > 0 and row[-1] == "yes", row  # timed, and the same transcripts


def test_stage_threads_tiny() -> None:
    """bench/stage_threads.py --tiny: recognition and synthesis timed with one and with two threads, every column."""
    proc = run_script("stage_threads", "--tiny")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:2] in ("1 ", "2 ")]
    assert [r[0] for r in rows] == ["1", "2", "1", "2"], proc.stdout  # Whisper's table, then Piper's
    assert all(float(x) > 0 for r in rows for x in r[1:]) and [len(r) for r in rows] == [9, 9, 3, 3], rows


def test_remote_ahead_tiny(tmp_path: Path) -> None:
    """bench/remote_ahead.py's smoke form (it starts its own `parley stages`): with the 1-token warm-up the reply
    finds its prompt cached and prefills about one token; without it, the turn's new words."""
    out = tmp_path / "remote_ahead.json"
    proc = run_script("remote_ahead", "--tiny", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"no warm-up", "1-token warm-up"} and len(rows["no warm-up"]) == len(rows["1-token warm-up"]) > 0
    assert all(r["prefilled"] <= 2 and r["warm_ms"] > 0 for r in rows["1-token warm-up"])
    assert all(r["prefilled"] > 2 for r in rows["no warm-up"])


def test_turns_sweep_tiny(tmp_path: Path) -> None:
    """--sweep runs each detector once per value of one policy field, and the value is the one the run used: the
    fixed detector's endpoints come no sooner than each swept hangover."""
    out = tmp_path / "turns.json"
    proc = run_script("turns", "--tiny", "--detectors", "fixed", "--sweep", "hangover_ms=300,700", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert list(result["detectors"]) == ["fixed (hangover_ms 300)", "fixed (hangover_ms 700)"]
    for name, hangover in (("fixed (hangover_ms 300)", 300.0), ("fixed (hangover_ms 700)", 700.0)):
        delays = [c["delay_ms"] for c in result["detectors"][name]["clips"] if c["delay_ms"] is not None]
        assert delays and min(delays) >= hangover
    short, long = (result["detectors"][n]["delay_p50"] for n in ("fixed (hangover_ms 300)", "fixed (hangover_ms 700)"))
    assert long - short >= 300.0
    bad = run_script("turns", "--tiny", "--sweep", "no_such_field=1")
    assert bad.returncode != 0 and "TurnPolicy field" in bad.stderr


def test_startup_tiny(tmp_path: Path) -> None:
    """bench/startup.py's smoke form: one start to its listening line, with the server's own account of each stage's
    load; the later starts' median row only comes with --runs."""
    out = tmp_path / "startup.json"
    proc = run_script("startup", "--tiny", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    first = result["first"]
    assert first["listening_s"] >= first["ready_s"] > 0 and result["starts"] == []
    assert set(first["stages"]) >= {"vad", "asr", "llm", "tts"} and all(v >= 0 for v in first["stages"].values())
    assert sum(first["stages"].values()) <= first["ready_s"] + 0.5  # each stage's load is part of the whole
    assert "first start" in proc.stdout and "median of" not in proc.stdout


def test_interruptions_tiny(real_server: ParleyProcess, tmp_path: Path) -> None:
    out = tmp_path / "interruptions.json"
    proc = run_script("interruptions", "--tiny", "--server", real_server.url, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    outcomes = json.loads(out.read_text())
    by_family = {f: [o for o in outcomes if o["family"] == f] for f in ("backchannel", "noise", "echo", "real")}
    assert all(by_family.values()) and all(o["error"] is None for o in outcomes), outcomes
    for family in ("backchannel", "noise", "echo"):  # "yeah", music at -25 dBFS, its own voice at -10 dB: it plays on
        assert [(o["stopped"], o["turns_opened"]) for o in by_family[family]] == [(False, 0)] * len(by_family[family]), outcomes
    assert by_family["backchannel"][0]["resume_ms"] > 0  # held at once, then resumed by the server's word
    for o in by_family["real"]:  # "Wait, stop." and a request spoken over the echo: stopped, and answered
        assert o["stopped"] and o["turns_opened"] >= 1 and o["decision_ms"] > 0 and o["answered"], outcomes
    assert "replies stopped" in proc.stdout and "| echo | 1 | 0 | 0 |" in proc.stdout


def test_load_churn_tiny(real_server: ParleyProcess, tmp_path: Path) -> None:
    """Two users arriving by the seeded Poisson process, one question each, then leaving."""
    out = tmp_path / "churn.json"
    proc = run_script("load", "--churn", "--tiny", "--server", real_server.url, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["arrivals"] == 2 and r["refused"] + r["errors"] == 0 and r["turns"] == 2, r["error_list"]
    assert_two_turns(r["v2v_median"], r["v2v_p95"], r["summary"]["voice_to_voice"])
    assert 1 <= r["open_max"] <= 2
    assert r["greetings_synthesised"] + r["greetings_reused"] >= 2  # each user heard the greeting (concise has one)
    assert r["busy_s"]["llm"] > 0 and r["busy_s"]["asr"] > 0 and r["busy_s"]["tts"] > 0  # /metrics: where time went
    assert all(column in proc.stdout for column in ("Churn", "greetings synth/replayed", "open mean/max"))


def test_tools_tiny(tmp_path: Path) -> None:
    out = tmp_path / "tools.json"
    proc = run_script("tools", "--tiny", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["requests"] == 4 and result["auto"]["requests"] == 4 and result["required"]["requests"] == 3
    forced = result["required"]
    assert forced["valid"] == forced["calls"] and forced["calls"] + forced["cut"] >= 3  # valid by construction
    assert result["mask"]["free_tok_s"] > 0 and result["mask"]["grammar_tok_s"] > 0 and result["mask"]["mask_ms"] > 0
    assert "tool_choice" in proc.stdout and "of a decode step" in proc.stdout
    voice = result["voice"]  # one spoken "what time is it?" to a real server, the persona forcing the time tool
    assert voice["turns"] == 1 and voice["tool_turns"] == 1 and not voice["errors"], voice
    assert voice["v2v_median"] > 0 and voice["tool_ms_median"] >= 0 and voice["replies"][0].strip(), voice
    assert "Voice-to-voice with a tool call in the turn" in proc.stdout and "does not choose tools" in proc.stdout


def test_tools_default_tiny(tmp_path: Path) -> None:
    out = tmp_path / "tools_default.json"
    proc = run_script("tools_default", "--tiny", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["requests"] == 4 and result["tokens"]["with"] > result["tokens"]["without"] > 0
    assert all(result["cost"][k]["decode_tok_s"] > 0 for k in ("without", "with"))
    assert list(result["auto"]) == ["our prompt format"]  # the embedded SmolLM2's template has no tools of its own
    assert result["auto"]["our prompt format"]["wanted"] == 3 and result["auto"]["our prompt format"]["no_tool"] == 1
    assert "calls when none was wanted" in proc.stdout
    assert result["auto_offers_tools"] is False and "does not render tools" in result["why"]  # the embedded model


def test_quality_tiny(tmp_path: Path) -> None:
    """bench/quality.py's smoke form on the shipped LLM: four questions answered and scored, the table printed and
    every reply in the JSON; a model that cannot be found is skipped with one line. Whether the replies are right
    is the benchmark's own number, not asserted here."""
    out, missing = tmp_path / "quality.json", tmp_path / "missing.gguf"
    proc = run_script("quality", "--tiny", "--models", f"embedded,{missing}", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    ran, skipped = result["models"]
    assert result["questions"] == 4 and ran["error"] is None and ran["total"] == 4 and len(ran["answers"]) == 4
    assert all(a["reply"] and a["finish"] in ("stop", "length") for a in ran["answers"]), ran["answers"]
    assert ran["right"] == sum(a["right"] for a in ran["answers"]) and ran["load_s"] > 0
    assert ran["first_token_ms_median"] > 0 and ran["decode_tok_s_median"] > 0
    assert skipped["error"].startswith("not found") and skipped["answers"] == []
    assert f"{missing}: skipped, not found" in proc.stdout
    assert "| model | right / total | % |" in proc.stdout and f"| embedded | {ran['right']} / 4 |" in proc.stdout


def test_native_chunks_tiny() -> None:
    """bench/native_chunks.py on the 135M: both paths' chunk times, and the compiled step's logits are torch's."""
    proc = run_script("native_chunks", "--tiny")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["4"], ["20"])]
    assert len(rows) == 2 and all(r[-1] == "yes" and float(r[-2]) > 0.999 for r in rows), proc.stdout
    assert "compiled CPU step" in proc.stdout and "batched rows" in proc.stdout
