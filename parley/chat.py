"""`parley chat`: a terminal chat with the LLM engine (persona system prompt, streamed reply, TTFT and tokens/s).

run_chat() is the loop over any object shaped like llm_engine's Engine; chat_command() builds the real
engine from the config. It knows nothing about audio or sockets.
"""
from __future__ import annotations

import sys
import uuid
from typing import Any, Callable, TextIO

HELP = "Type a message. /reset starts over, /quit (or Ctrl-D) leaves; Ctrl-C stops a reply."


def run_chat(
    engine: Any,
    persona_system_prompt: str,
    greeting: str | None,
    *,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    read_line: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
) -> None:
    from llm_engine.request import ChatMessage, FinishEvent, GenerateRequest, SamplingParams, TokenEvent

    session = f"chat-{uuid.uuid4().hex[:8]}"
    system = ChatMessage("system", persona_system_prompt)
    history: list[ChatMessage] = [system]
    if greeting:
        history.append(ChatMessage("assistant", greeting))
        print(f"assistant> {greeting}", file=out)
    print(HELP, file=out)
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    try:
        while True:
            try:
                line = read_line("you> ").strip()
            except EOFError:
                break
            if line in ("/quit", "/exit"):
                break
            if line == "/reset":
                history = [system]
                engine.release(session)
                print("(conversation reset)", file=out)
                continue
            if not line:
                continue
            history.append(ChatMessage("user", line))
            stream = engine.submit(GenerateRequest(session, tuple(history), sampling))
            print("assistant> ", end="", file=out, flush=True)
            parts: list[str] = []
            try:
                for ev in stream:
                    if isinstance(ev, TokenEvent):
                        parts.append(ev.text)
                        print(ev.text, end="", file=out, flush=True)
                    elif isinstance(ev, FinishEvent):
                        t = ev.timings
                        print(
                            f"\n  [{ev.reason}: first token {t.first_token_ms:.0f} ms, "
                            f"{t.decode_tokens_per_s:.1f} tok/s, {t.reused_tokens} cached + {t.prefill_tokens} new prompt tokens]",
                            file=out,
                        )
                    else:
                        print(f"\n  [error: {ev.message}]", file=out)
            except KeyboardInterrupt:
                stream.cancel()
                for _ in stream:
                    pass  # drain to the cancelled finish so the session is free for the next turn
                print("\n  [stopped]", file=out)
            # Keep what was said, so the next turn's prompt matches the cache and reuses it.
            history.append(ChatMessage("assistant", "".join(parts)))
    finally:
        engine.release(session)


def chat_command(cfg: Any, persona: str | None) -> int:
    """Build the engine the config names and chat with the chosen persona."""
    from llm_engine.engine import Engine
    from parley.locate import resolve

    p = cfg.persona(persona)
    m = cfg.models.llm
    device = "cpu" if m.device == "auto" else m.device
    print(f"loading {m.source} LLM ...", file=sys.stderr)
    engine = Engine.from_path(
        resolve("llm", m.source, allow_downloads=cfg.models.allow_downloads),
        device=device, dtype=m.dtype, max_seq_len=m.max_seq_len, max_slots=1, quant=m.quant, group_size=m.group_size,
        native=m.native, kv_cache=m.kv_cache,
    )  # fmt: skip
    print(f"loaded in {engine.load_s:.1f} s; persona {p.display_name}", file=sys.stderr)
    engine.start()
    try:
        run_chat(engine, p.system_prompt, p.greeting, max_new_tokens=p.max_reply_tokens, temperature=p.temperature)
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    from parley.config import load_config

    sys.exit(chat_command(load_config(None, []), sys.argv[1] if len(sys.argv) > 1 else None))
