"""Tables bench/llm.py prints after its own: a new session's time to first token with a ~300-token persona
prompt, cold against a prefix-cache hit; decode speed at the sizes people download (random-weight GGUFs
shaped like Qwen2.5-0.5B and a 1.5B Llama, bench/model_shapes.py), ours beside llama.cpp on the same file; and
ours against llama.cpp in alternating runs on the real Gemma 3 270M file and the embedded model.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch
from bench.llm_speed import run_llama_cpp, run_plain
from bench.model_shapes import SHAPES, write

from llm_engine.engine import Engine
from llm_engine.native.decoder import default_kernel, kernels_used
from llm_engine.prepare import prepare
from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams
from llm_engine.threads import on_own_thread

PERSONA = (
    "You are Juniper, the voice of a small family bakery in the old town. You know the opening hours (seven to six on"
    " weekdays, eight to two on Saturdays, closed on Sundays), the breads (rye, spelt, sourdough, a seeded loaf and"
    " the Friday challah), the cakes (apple, plum in season, cheesecake, and a chocolate cake that must be ordered a"
    " day ahead) and the coffee (from a roaster two streets away). You take orders for pickup, never for delivery."
    " You speak in one or two short sentences, warmly, and you never read out lists: you name two or three things"
    " and offer the rest. If someone asks about allergies, you say which breads have nuts or seeds and that the"
    " kitchen handles wheat, milk and eggs. If you do not know something, you say so and offer to ask the baker."
    " You do not make up prices: a loaf is four to six euros, a slice of cake three fifty, and a coffee two euros."
    " Orders for more than ten loaves need two days' notice, and birthday cakes need three; you ask for a name and a"
    " pickup time, repeat both back, and say the order is only final once the baker confirms it by text message."
    " On holidays the bakery keeps Saturday hours, and in August it closes for two weeks, which you mention if asked."
)
QUESTIONS = ["When do you open on Saturday?", "Do you have rye bread today?", "Can I order a chocolate cake?",
             "Is there anything without nuts?", "How much is a coffee?", "Do you deliver?"]  # fmt: skip


def persona_table(path: Path, *, sessions: int = 6) -> None:
    """Each new session asks one question under the same persona; TTFT and prompt tokens computed, median."""
    print(f"\nA new session's first reply under a {len(PERSONA.split())}-word persona prompt (embedded model, int4, "
          f"median of {sessions} sessions):")  # fmt: skip
    print(f"{'prefix cache':32s} {'TTFT ms':>8s} {'prompt tokens':>14s} {'computed':>9s} {'copied':>7s}")
    for on in (False, True):
        engine = on_own_thread(lambda: Engine.from_path(path, quant="int4", max_slots=4, max_seq_len=1024, prefix_cache=on))
        engine.start()
        try:
            warm = (ChatMessage("system", PERSONA), ChatMessage("user", "Hello!"))
            engine.submit(GenerateRequest("first", warm, SamplingParams(max_new_tokens=4))).collect()
            ttft, total, computed, copied = [], [], [], []
            for i in range(sessions):
                msgs = (ChatMessage("system", PERSONA), ChatMessage("user", QUESTIONS[i % len(QUESTIONS)]))
                _, _, fin = engine.submit(GenerateRequest(f"s{i}", msgs, SamplingParams(max_new_tokens=2))).collect()
                engine.release(f"s{i}")
                t = fin.timings
                ttft.append(t.first_token_ms)
                total.append(t.prefill_tokens + t.reused_tokens)
                computed.append(t.prefill_tokens)
                copied.append(t.shared_prefix_tokens)
        finally:
            engine.stop()
        print(f"{'on (copied from an idle slot)' if on else 'off (cold prefill)':32s} {statistics.median(ttft):8.0f}"
              f" {statistics.median(total):14.0f} {statistics.median(computed):9.0f} {statistics.median(copied):7.0f}")  # fmt: skip


def shapes_table(names: list[str], qtypes: list[str], cache: Path, smol_folder: Path, n: int = 32, llama_cpp: bool = True) -> None:
    """Decode tokens/s after a 40-token prompt, ours (int4 from the file's blocks, the compiled step) and llama.cpp."""
    print(f"\nDecode at real sizes (random weights, {n} greedy tokens after a 40-token prompt, {torch.get_num_threads()}"
          " threads; ours: llm.quant int4, the file's 4-bit blocks taken as they are):")  # fmt: skip
    print(f"{'model shape':14s} {'params':>7s} {'type':>5s} {'file MB':>8s} {'ours tok/s':>11s} {'llama.cpp':>10s}"
          f" {'ratio':>6s}  our decode step")  # fmt: skip
    cache.mkdir(parents=True, exist_ok=True)
    for name in names:
        for qtype in qtypes:
            try:
                path = write(name, qtype, cache / f"{name}-{qtype}.gguf", smol_folder)
            except ValueError as exc:
                print(f"{name:14s} {SHAPES[name].params() / 1e9:6.2f}B {qtype:>5s}  skipped: {exc}")
                continue
            model = on_own_thread(lambda: prepare(path, device="cpu", dtype="float32", max_seq_len=512, quant="int4",
                                                  group_size=32, self_draft="none", kv_cache="auto").model)  # fmt: skip
            prompt = list(range(1000, 1040))
            on_own_thread(lambda: run_plain(model, prompt[:8], 4, compiled=True))  # warm-up
            ours = max(on_own_thread(lambda: run_plain(model, prompt, n, compiled=True))[1] for _ in range(2))
            kernels = kernels_used(model, default_kernel())
            del model
            lc = run_llama_cpp(path, prompt, n) if llama_cpp else "skipped"
            lc_tps = lc[1] if not isinstance(lc, str) else None
            ratio = f"{ours / lc_tps:5.2f}x" if lc_tps else "    -"
            lc_cell = f"{lc_tps:10.1f}" if lc_tps else f"{lc:>10.10s}"
            print(f"{name:14s} {SHAPES[name].params() / 1e9:6.2f}B {qtype:>5s} {path.stat().st_size / 1e6:8.0f}"
                  f" {ours:11.1f} {lc_cell} {ratio}  {kernels}", flush=True)  # fmt: skip


def alternating_table(files: dict[str, Path], runs: int = 3, n: int = 32, llama_cpp: bool = True) -> None:
    """Ours (llm.quant int4: a file's 4-bit blocks as stored, its wider projections int8; the compiled step) and llama.cpp
    on each file, alternating `runs` times: decode tokens/s after a 40-token prompt, medians and the ratio's spread."""
    print(f"\nOurs vs llama.cpp on the same file, {runs} alternating runs, {n} greedy tokens after a 40-token prompt,"
          f" {torch.get_num_threads()} threads:")  # fmt: skip
    print(f"{'model':30s} {'file MB':>7s} {'ours tok/s (median, min-max)':>29s} {'llama.cpp tok/s':>22s}"
          f" {'ratio (median, min-max)':>25s}  our decode step")  # fmt: skip
    for label, path in files.items():
        model = on_own_thread(lambda: prepare(path, device="cpu", dtype="float32", max_seq_len=512, quant="int4",
                                              group_size=32, self_draft="none", kv_cache="auto").model)  # fmt: skip
        kernels = kernels_used(model, default_kernel())
        prompt = list(range(1000, 1040))
        on_own_thread(lambda: run_plain(model, prompt[:8], 4, compiled=True))  # warm-up
        ours, theirs, why = [], [], ""
        for _ in range(runs):
            ours.append(on_own_thread(lambda: run_plain(model, prompt, n, compiled=True))[1])
            lc = run_llama_cpp(path, prompt, n) if llama_cpp else "skipped"
            if isinstance(lc, str):
                why = lc
            else:
                theirs.append(lc[1])
        del model
        spread = lambda xs, f: f"{statistics.median(xs):{f}} ({min(xs):{f}}-{max(xs):{f}})"  # noqa: E731
        ratios = [a / b for a, b in zip(ours, theirs)]
        print(f"{label:30s} {path.stat().st_size / 1e6:7.0f} {spread(ours, '.1f'):>29s} {spread(theirs, '.1f') if theirs else why[:22]:>22s}"
              f" {spread(ratios, '.2f') + 'x' if ratios else '-':>25s}  {kernels}", flush=True)  # fmt: skip


def gemma3_table(runs: int = 3, n: int = 32, llama_cpp: bool = True, embedded: Path | None = None) -> None:
    """alternating_table on the real Gemma 3 270M Q4_K_M file (parley.locate.gemma3_270m_file), and the embedded model."""
    from parley.locate import gemma3_270m_file

    files = {"Gemma 3 270M Q4_K_M": gemma3_270m_file(), **({"SmolLM2-135M Q4_1 (embedded)": embedded} if embedded else {})}
    alternating_table(files, runs, n, llama_cpp)


if __name__ == "__main__":
    import sys

    from bench.llm_speed import llm_path

    gemma3_table(int(sys.argv[1]) if len(sys.argv) > 1 else 3, embedded=llm_path(None))
