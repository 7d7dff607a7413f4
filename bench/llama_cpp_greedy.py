"""llama.cpp's greedy tokens on an embedded model's file, written as the reference tests/llm_engine/test_qwen_file.py
holds our engine to (llama-cpp-python is a benchmark-only dependency: the suite reads the cached JSON).

`python -m bench.llama_cpp_greedy [--model embedded-0.5b] [--tokens 16] [--out tests/llm_engine/data/...json]`
The prompts are the model's own chat template over three questions, so the test needs no template of its own.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

QUESTIONS = ("What is the tallest mountain on Earth?", "Explain in one sentence why the sky is blue.",
             "Write a haiku about autumn rain.")  # fmt: skip
SYSTEM = "You are a helpful assistant."
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "llm_engine" / "data" / "qwen05_llama_cpp_greedy.json"

# Child process: a natively built llama.cpp can crash in its batched prompt kernels on some VMs (bench/llm_speed.py)
_CHILD = """
import json, sys
from llama_cpp import Llama
path, n = sys.argv[1], int(sys.argv[2])
llm = Llama(model_path=path, n_ctx=512, n_threads=2, n_batch=512, verbose=False)
out = []
for ids in json.loads(sys.stdin.read()):
    toks = []
    for t in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        toks.append(int(t))
        if len(toks) == n:
            break
    out.append(toks)
print(json.dumps(out))
"""


def prompts(model: Path) -> list[list[int]]:
    from llm_engine.gguf_loader import prepare_gguf
    from llm_engine.request import ChatMessage
    from llm_engine.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(prepare_gguf(model, weights=False))
    return [tok.apply_chat_template([ChatMessage("system", SYSTEM), ChatMessage("user", q)]) for q in QUESTIONS]


def main() -> None:
    from parley.locate import find_embedded

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded-0.5b")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    path = find_embedded("llm", args.model)
    ids = prompts(path)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(args.tokens)], input=json.dumps(ids),
                          capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    tokens = json.loads(proc.stdout.strip().splitlines()[-1])
    import llama_cpp

    args.out.write_text(json.dumps({"model": args.model, "file_bytes": path.stat().st_size,
                                    "llama_cpp": llama_cpp.__version__, "questions": QUESTIONS, "system": SYSTEM,
                                    "prompts": ids, "greedy": tokens}, indent=1) + "\n")  # fmt: skip
    print(f"wrote {args.out}: {[len(t) for t in tokens]} tokens")


if __name__ == "__main__":
    main()
