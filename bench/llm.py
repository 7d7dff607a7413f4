"""LLM engine speed on the embedded SmolLM2 (or --model a .gguf): one run, one table.

Rows: our engine at none (fp32) / int8 / int4, each with decode steps in torch eager, through the compiled
CPU step (llm_engine/native), and with speculation (int4 self-draft, torch); continuous batching at 1/4/8
concurrent requests (aggregate tokens/s through the threaded Engine, compiled step and torch); transformers
`generate` on the same weights; llama.cpp (llama-cpp-python) on the same GGUF. Our rows keep keys and
values in float16, as the engine does on CPU by default (llama.cpp's default too; transformers: float32).
Then decode speed with 40..2000 cached positions, ours with a float32 and a float16 cache, and llama.cpp; then
(bench/llm_kv.py) float16 vs int8 keys and values at 256 / 2000 / 8000 positions, tokens/s and MB per slot; then
decode tok/s free and under a JSON grammar, and the mask's ms per token (bench/tools.py's measurement).
Columns: time to first token, decode tokens/s, ratio to transformers and to llama.cpp, greedy tokens equal
to the fp32 row, weight bytes read per decode step, and the % of the copy-bandwidth bound that reaches.
Then (bench/llm_models.py) a new session's TTFT under a ~300-token persona prompt, cold vs a prefix-cache hit,
and with --shapes, decode speed at real sizes (random-weight GGUFs shaped like Qwen2.5-0.5B and a 1.5B Llama in
Q4_1 / Q4_K), ours beside llama.cpp on the same file.
Usage: HF_HUB_OFFLINE=1 .venv/bin/python -m bench.llm [--tokens 64] [--batch-tokens 32] [--batches 1,4,8] [--threads N]
       [--shapes qwen2.5-0.5b,llama-1.5b] [--shape-types Q4_1,Q4_K]
"""
from __future__ import annotations

import argparse
import copy
import os
from functools import partial
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from bench.cpu_classes import cpu_flags  # noqa: E402
from bench.llm_batch import aggregate_throughput  # noqa: E402
from bench.llm_kv import kv_table  # noqa: E402
from bench.llm_models import gemma3_table, persona_table, shapes_table  # noqa: E402
from bench.model_shapes import SHAPES  # noqa: E402
from bench.llm_speed import (  # noqa: E402
    copy_bandwidth_gb_s,
    llm_path,
    llama_cpp_rate_at,
    native_rate_at,
    run_llama_cpp,
    run_plain,
    run_speculative,
    run_transformers,
)

from llm_engine.engine import Engine  # noqa: E402
from llm_engine.fuse import fuse_projections  # noqa: E402
from llm_engine.gguf_quant import read_quantized_linears  # noqa: E402
from llm_engine.loader import load_model  # noqa: E402
from llm_engine.model import Transformer  # noqa: E402
from llm_engine.native.decoder import default_kernel  # noqa: E402
from llm_engine.quantize import quantize_model, weight_bytes_per_token  # noqa: E402
from llm_engine.speculative import make_self_draft  # noqa: E402
from llm_engine.threads import on_own_thread  # noqa: E402
from llm_engine.tokenizer import ChatMessage, Tokenizer  # noqa: E402

PROMPT = "Tell me a short story about a lighthouse keeper and a storm."


@dataclass(frozen=True)
class Row:
    name: str
    ttft_ms: float | None
    tokens_per_s: float
    greedy: str  # "=" same tokens as the fp32 row, "differs@i", or "-"
    bytes_per_step: int | None  # weight bytes one decode step reads
    steps_per_s: float  # decode steps per second (tokens/s over the batch; speculation: target forwards)


def variants(path: Path, model: Transformer) -> dict[str, Transformer]:
    """fp32, int8 and int4 (GGUF Q4_1 blocks as stored), all with fused projections; the quantized two also
    read an int8 output head, as Engine.from_path builds them."""
    gguf = read_quantized_linears(path, "int4") if path.suffix == ".gguf" else {}
    out = {
        "none (fp32)": model,
        "int8": quantize_model(copy.deepcopy(model), "int8"),
        "int4 (Q4_1 blocks)": quantize_model(copy.deepcopy(model), "int4", replacements=gguf),
    }
    return {name: fuse_projections(m) for name, m in out.items()}


def same_as(out: list[int], reference: list[int]) -> str:
    first = next((i for i, (a, b) in enumerate(zip(out, reference)) if a != b), None)
    return "=" if first is None else f"differs@{first}"


def single_request_rows(path: Path, prompt: list[int], n: int) -> tuple[list[Row], list[int]]:
    """-> the rows, and the fp32 row's greedy tokens (the reference the others are compared with)."""
    model, _ = load_model(path, max_seq_len=512)
    draft = fuse_projections(make_self_draft(model, scheme="int4"))
    rows: list[Row] = []
    reference: list[int] | None = None
    for name, m in variants(path, model).items():
        nbytes = weight_bytes_per_token(m)
        for path_name, run in (("torch eager", run_plain), ("compiled step", partial(run_plain, compiled=True))):
            run(m, prompt[:8], 4)  # warm-up: kernel layouts, allocator, the library's first load
            ttft, tps, out = max((run(m, prompt, n) for _ in range(2)), key=lambda r: r[1])  # the less disturbed run
            reference = reference or out
            rows.append(show(Row(f"{name}, {path_name}", ttft, tps, same_as(out, reference), nbytes, tps)))
        ttft, tps, sout, acc = run_speculative(m, draft, prompt, n)
        rows.append(show(Row(f"{name} + speculation, acceptance {acc:.2f}", ttft, tps, same_as(sout, out),
                             None, tps)))  # fmt: skip
    assert reference is not None
    return rows, reference


def context_table(path: Path, positions: list[int], text: list[int], llama_cpp: bool, steps: int = 32) -> None:
    """The default path (int4, compiled step) decoding with longer conversations behind it, with a float32
    and a float16 KV cache, beside llama.cpp after prompts of those lengths."""
    model, _ = load_model(path, max_seq_len=max(positions) + 1)
    gguf = read_quantized_linears(path, "int4") if path.suffix == ".gguf" else {}
    model = fuse_projections(quantize_model(model, "int4", replacements=gguf))
    print("\nOne request, decode tokens/s with this many cached positions (int4; ours at a fixed position, best of three"
          f" {steps}-step runs; llama.cpp: 32 tokens after a prompt of that length, best of two)")
    print(f"{'':50s}" + "".join(f"{p:>10d}" for p in positions))
    for name, dtype in (("ours, compiled step, float32 KV cache", torch.float32),
                        ("ours, compiled step, float16 KV cache (default)", torch.float16)):  # fmt: skip
        print(f"{name:50s}" + "".join(f"{r:10.1f}" for r in native_rate_at(model, positions, dtype, steps)), flush=True)
    if llama_cpp:
        found = llama_cpp_rate_at(path, text, positions)
        rates = found if isinstance(found, str) else "".join(f"{r:10.1f}" for r in found)
        print(f"{'llama.cpp (same GGUF, float16 KV cache)':50s}{rates}")


def batching_rows(path: Path, quant: str, native: str, new_tokens: int, sizes: tuple[int, ...]) -> list[Row]:
    # Loaded on a thread that exits; this thread only waits on the streams, so the engine thread's OpenMP
    # pool is the only live one while it decodes, as in the server.
    engine = on_own_thread(
        lambda: Engine.from_path(path, max_seq_len=512, max_slots=max(sizes), quant=quant, native=native)
    )
    label = "compiled step" if engine.native is not None else "torch"
    nbytes = weight_bytes_per_token(engine.model)
    engine.start()
    try:
        found = aggregate_throughput(engine, sizes, new_tokens)
    finally:
        engine.stop()
    return [
        show(Row(f"{quant}, {label}: {r.batch} concurrent requests, Engine (aggregate)", r.first_token_ms, r.aggregate_tokens_per_s,
                 "-", nbytes, r.aggregate_tokens_per_s / r.batch))  # fmt: skip
        for r in found
    ]


BW_GB_S = 0.0  # set once per run by main(): every row's % of the bound uses the same measurement


def show(row: Row) -> Row:
    """Each row prints as soon as it is measured: a slow, shared machine still leaves a partial table."""
    ttft = f"{row.ttft_ms:8.0f}" if row.ttft_ms is not None else f"{'n/a':>8s}"
    mb = f"{row.bytes_per_step / 1e6:8.0f}" if row.bytes_per_step else f"{'-':>8s}"
    pct = f"{100 * row.steps_per_s * row.bytes_per_step / (BW_GB_S * 1e9):6.0f}%" if row.bytes_per_step else f"{'-':>7s}"
    print(f"{row.name:62s} {ttft} {row.tokens_per_s:7.1f} {row.greedy:>10s} {mb} {pct}", flush=True)
    return row


def main() -> None:
    global BW_GB_S
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="a .gguf (default: the embedded SmolLM2)")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens per single-request row")
    ap.add_argument("--batch-tokens", type=int, default=32, help="tokens per request in the batching rows")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--batches", default="1,4,8", help="concurrent requests in the batching rows")
    ap.add_argument("--contexts", default="40,300,1000,2000", help="cached positions for the context table")
    ap.add_argument("--context-steps", type=int, default=32, help="decode steps per timed run in the context table")
    ap.add_argument("--kv-contexts", default="256,2000,8000", help="cached positions for the float16 vs int8 KV table")
    ap.add_argument("--persona-sessions", type=int, default=6, help="new sessions in the persona table (0: skip it)")
    ap.add_argument("--shapes", default="", help="model shapes for the real-size table (bench/model_shapes.py), or all")
    ap.add_argument("--shape-types", default="Q4_1,Q4_K", help="GGUF types for the real-size table")
    ap.add_argument("--gemma3", type=int, default=0, help="alternating runs, ours vs llama.cpp, on the real Gemma 3 270M and the model (0: skip)")
    ap.add_argument("--grammar-rounds", type=int, default=5, help="alternated runs free / under a JSON grammar (0: skip)")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--skip-llama-cpp", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.model = llm_path(args.model)
    # Every phase runs on a thread of its own that then exits: see llm_engine.threads.
    _, folder = on_own_thread(lambda: load_model(args.model, max_seq_len=8))
    prompt = Tokenizer.from_folder(folder).apply_chat_template([ChatMessage("user", PROMPT)])
    BW_GB_S = on_own_thread(copy_bandwidth_gb_s)
    print(f"model {args.model.name}, prompt {len(prompt)} tokens, {args.tokens} greedy tokens per request, "
          f"{torch.get_num_threads()} threads, copy bandwidth {BW_GB_S:.1f} GB/s, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    kernel = on_own_thread(default_kernel)
    print(f"CPU features: {cpu_flags()}; the compiled step's int8-input kernel: {kernel or 'none (the float kernels)'} "
          "(each compiled row's kernels: `parley serve`'s log, or bench.cpu_classes for both CPU classes)\n")  # fmt: skip
    print(f"{'engine / variant':62s} {'TTFT ms':>8s} {'tok/s':>7s} {'greedy':>10s} {'MB/step':>8s} {'% of BW':>7s}")
    rows, reference = on_own_thread(single_request_rows, args.model, prompt, args.tokens)
    sizes = tuple(int(b) for b in args.batches.split(","))
    for quant, native in (("none", "on"), ("int4", "on"), ("int4", "off")):
        rows += batching_rows(args.model, quant, native, args.batch_tokens, sizes)
    baselines: dict[str, float] = {}
    if not args.skip_transformers:
        ttft, tps, hout = on_own_thread(run_transformers, folder, prompt, args.tokens)
        fp32_bytes = next(r.bytes_per_step for r in rows if r.name.startswith("none (fp32)"))
        rows.append(show(Row("transformers generate (fp32, same weights)", ttft, tps, same_as(hout, reference), fp32_bytes, tps)))
        baselines["transformers"] = tps
    lc = "skipped" if args.skip_llama_cpp else run_llama_cpp(args.model, prompt, args.tokens)
    if isinstance(lc, str):
        print(f"{'llama.cpp (llama-cpp-python)':62s} {lc}")
    else:
        rows.append(show(Row("llama.cpp (llama-cpp-python, same GGUF)", lc[0], lc[1], "-", None, lc[1])))
        baselines["llama.cpp"] = lc[1]
    on_own_thread(context_table, args.model, [int(p) for p in args.contexts.split(",")], prompt, not args.skip_llama_cpp,
                  args.context_steps)
    on_own_thread(kv_table, args.model, [int(p) for p in args.kv_contexts.split(",")], args.context_steps)
    if args.grammar_rounds:
        from bench.tools import cost_line, grammar_cost

        cost = grammar_cost(args.model, args.grammar_rounds, args.tokens)
        print(f"\nConstrained decoding (bench/tools.py, a JSON schema; medians of {args.grammar_rounds} alternated runs, "
              f"{args.tokens} tokens, engine at fp32 defaults):\n{cost_line(cost)}")  # fmt: skip
    if baselines:
        print("\nRatios of decode tokens/s (the same run, the same cores):")
        print(f"{'engine / variant':62s}" + "".join(f"{'vs ' + b:>16s}" for b in baselines))
        for row in rows:
            if not row.name.startswith(("transformers", "llama.cpp")):
                print(f"{row.name:62s}" + "".join(f"{row.tokens_per_s / v:15.2f}x" for v in baselines.values()))
    print("\ngreedy '=': the same tokens as the first (fp32, torch eager) row; speculative rows: as their own torch row."
          " A quantized torch row can part at a near-tie: torch's int4/int8 kernels round activations to bfloat16, with a"
          " blocking that depends on the row count. The compiled step computes in float32 (its int4 kernel splits each"
          " input into two int8 parts, ~16 bits).\nMB/step: weight"
          " bytes one decode step reads (speculation: '-', it varies with the draft length). TTFT 'n/a': llama.cpp fed the"
          " prompt one token at a time after its batched kernels crashed.")  # fmt: skip
    if args.persona_sessions:
        persona_table(args.model, sessions=args.persona_sessions)
    if args.shapes:
        import platformdirs

        names = list(SHAPES) if args.shapes == "all" else args.shapes.split(",")
        shapes_table(names, args.shape_types.split(","), Path(platformdirs.user_cache_dir("parley")) / "bench-shapes", folder,
                     llama_cpp=not args.skip_llama_cpp)
    if args.gemma3:
        gemma3_table(args.gemma3, llama_cpp=not args.skip_llama_cpp, embedded=args.model)


if __name__ == "__main__":
    main()
