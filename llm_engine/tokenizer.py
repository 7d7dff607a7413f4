"""Tokenizer: encode/decode, the model's own chat template, stop tokens, and clean streaming text.

Wraps a transformers fast tokenizer (we use it for tokenization and templates only). It knows nothing
about models, caches or threads.
"""
from __future__ import annotations

import functools
import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from llm_engine.tool_format import ToolCall, ToolSpec, template_dicts, template_renders_tools

_PUNCTUATION = frozenset(string.punctuation) | frozenset("…¿¡«»“”‘’")
_SENTENCE_END = frozenset(".?!…")
_PROBE_TOOL = "parley_probe_tool"  # template_lists_tools: a name no template writes by itself


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str | None = None  # a tool result: the call it answers


class Tokenizer:
    def __init__(self, hf_tokenizer: Any, *, stop_strings: Sequence[str] = ()) -> None:
        self.hf = hf_tokenizer
        self.stop_strings = tuple(stop_strings)
        stops = set()
        if hf_tokenizer.eos_token_id is not None:
            stops.add(int(hf_tokenizer.eos_token_id))
        # Chat models often end a turn with a token that is not the tokenizer's eos.
        for tok in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<end_of_turn>"):
            tid = hf_tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != hf_tokenizer.unk_token_id and tid >= 0:
                stops.add(tid)
        self.stop_ids: frozenset[int] = frozenset(stops)
        self._tools_wording: dict[tuple[str, tuple[ToolSpec, ...]], str | None] = {}  # system_with_tools, once each

    @classmethod
    def from_folder(cls, folder: str | Path, *, stop_strings: Sequence[str] = ()) -> "Tokenizer":
        """A folder whose tokenizer_config names the generic fast tokenizer (what transformers writes for a GGUF's
        tokenizer, so every embedded or converted model) loads it directly: AutoTokenizer resolves that same class
        through transformers' model registry, ~5 s of imports on a 2-core server start against 0.4 s. A folder naming
        a model's own tokenizer class goes through AutoTokenizer, which picks that class."""
        config = Path(folder) / "tokenizer_config.json"
        named = json.loads(config.read_text()).get("tokenizer_class") if config.exists() else None
        if named in ("TokenizersBackend", "PreTrainedTokenizerFast") and (Path(folder) / "tokenizer.json").exists():
            from transformers import PreTrainedTokenizerFast

            return cls(PreTrainedTokenizerFast.from_pretrained(str(folder)), stop_strings=stop_strings)
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(folder)), stop_strings=stop_strings)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @functools.cached_property
    def renders_tools(self) -> bool:
        """The model's own template renders tools and `<tool_call>`s (else llm_engine.tool_format's prompt format)."""
        return template_renders_tools(getattr(self.hf, "chat_template", None))

    @functools.cached_property
    def template_lists_tools(self) -> bool:
        """The model's own template renders a `tools` list, whatever its call format (Qwen2.5/Qwen3, Llama 3.1+,
        Mistral...): the mark of a model trained to call tools. Rendered once with a probe tool: its name must show.
        A template without tools (the embedded SmolLM2) ignores the argument; one that fails to render says no."""
        probe = ToolSpec(_PROBE_TOOL, "Probe whether the chat template renders tools.").openai()
        try:
            text = self.hf.apply_chat_template([{"role": "user", "content": "Hello."}], tools=[probe],
                                               add_generation_prompt=True, tokenize=False)  # fmt: skip
        except Exception:  # no template, or one that cannot render this (jinja raises its own kinds)
            return False
        return _PROBE_TOOL in str(text)

    def system_with_tools(self, system: str, tools: Sequence[ToolSpec]) -> str | None:
        """The system message's text that renders, without a tools argument, exactly as the template renders `system`
        with `tools` (its own tool section, worded as the model was trained); None where the template does not
        render tools in the system message alone. A session keeps this one text as its system prompt, so every
        request of it (warm-up, prefill, reply) shares the tools in one cached prefix without passing them. Asked on
        every prompt a session builds, so each (system, tools) is rendered once."""
        if not tools or not system or not self.renders_tools:
            return None
        key = (system, tuple(tools))
        if key not in self._tools_wording:
            self._tools_wording[key] = self._worded(system, tools)
        return self._tools_wording[key]

    def _worded(self, system: str, tools: Sequence[ToolSpec]) -> str | None:
        probe = [ChatMessage("system", system), ChatMessage("user", "Hello.")]
        plain, tooled = self.render_chat(probe), self.render_chat(probe, tools=tools)
        at = plain.find(system)
        head, tail = plain[:at], plain[at + len(system) :]
        if at < 0 or not tooled.startswith(head) or not tooled.endswith(tail) or len(tooled) < len(plain):
            return None
        text = tooled[len(head) : len(tooled) - len(tail)]
        return text if self.render_chat([ChatMessage("system", text), probe[1]]) == tooled else None

    def render_chat(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True,
                    tools: Sequence[ToolSpec] = ()) -> str:  # fmt: skip
        dicts, tool_list = template_dicts(messages, tools, self.renders_tools)
        more = {"tools": tool_list} if tool_list else {}
        return str(self.hf.apply_chat_template(dicts, add_generation_prompt=add_generation_prompt, tokenize=False, **more))

    def apply_chat_template(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True,
                            tools: Sequence[ToolSpec] = ()) -> list[int]:  # fmt: skip
        # Render then encode without extra specials: the template already places bos/role markers.
        return self.encode(self.render_chat(messages, add_generation_prompt, tools))

    def detokenizer(self) -> "IncrementalDetokenizer":
        return IncrementalDetokenizer(self)

    @functools.cached_property
    def _punctuation_ids(self) -> tuple[frozenset[int], frozenset[int]]:
        """(tokens that are punctuation or white space alone, the punctuation that ends a sentence): one pass over
        the vocabulary, on the first end-of-turn probe."""
        skip, ends = set(), set()
        for i, piece in enumerate(self.hf.convert_ids_to_tokens(list(range(len(self.hf))))):
            # byte-level BPE and SentencePiece mark spaces and newlines with these
            text = (piece or "").replace("Ġ", " ").replace("Ċ", "\n").replace("▁", " ")
            if text and set(text.strip()) <= _PUNCTUATION:
                skip.add(i)
                if text.strip() and set(text.strip()) <= _SENTENCE_END:
                    ends.add(i)
        return frozenset(skip), frozenset(ends)

    def user_end_probe(self, messages: Sequence[ChatMessage], ids: Sequence[int],
                       tools: Sequence[ToolSpec] = ()) -> tuple[int, frozenset[int]] | None:  # fmt: skip
        """Where the prompt `ids` (the rendered `messages`) says whether the user's last message is complete.

        -> (k, end_ids): the index of the last word's token of that message, trailing punctuation skipped, and the
        tokens that would end the message right there: sentence-ending punctuation and whatever the chat template
        itself puts after the message (its end-of-turn token). P(end) = softmax(logits at k)[end_ids].sum().
        Reading it before the punctuation makes it independent of how the recogniser punctuated a fragment.
        None when the last message is not the user's, has no words, or cannot be located in the tokens."""
        if not messages or messages[-1].role != "user":
            return None
        content = messages[-1].content
        words = content.rstrip().rstrip("".join(_PUNCTUATION) + " \t\n")
        rendered = self.render_chat(messages, tools=tools)
        at = rendered.rfind(content)
        if not words or at < 0:
            return None
        end_char = at + len(words)
        enc = self.hf(rendered, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) != list(ids):
            return None
        offsets = enc["offset_mapping"]
        k = max((i for i, (start, _) in enumerate(offsets) if start < end_char), default=None)
        if k is None or offsets[k][1] > end_char or k + 1 >= len(ids):
            return None  # the last word's token runs past the text (merged with what follows): no clean boundary
        skip, sentence_ends = self._punctuation_ids
        j = k + 1
        while j < len(ids) - 1 and ids[j] in skip:
            j += 1
        return k, sentence_ends | {ids[j]}


class IncrementalDetokenizer:
    """Turns a growing token list into text deltas that concatenate to decode(all tokens).

    Decoding one token alone breaks byte-level BPE (a multi-byte character spans tokens) and
    SentencePiece spaces (a leading space depends on context). So we decode a short window that
    starts a few tokens back, and emit only once the text no longer ends in a replacement char.
    """

    def __init__(self, tokenizer: Tokenizer, context_tokens: int = 5) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start: decoded for context, never emitted again
        self.read_offset = 0  # everything before this has been emitted
        self.context_tokens = context_tokens

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self.tok.decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self.tok.decode(self.ids[self.prefix_offset :])
        if full_text.endswith("\ufffd") or len(full_text) <= len(prefix_text):
            return ""  # an incomplete UTF-8 sequence (or nothing visible yet): wait for more tokens
        delta = full_text[len(prefix_text) :]
        self.read_offset = len(self.ids)
        self.prefix_offset = max(0, self.read_offset - self.context_tokens)
        return delta

    def flush(self) -> str:
        """Whatever is still held back at the end of the stream (e.g. a dangling partial character)."""
        prefix_text = self.tok.decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self.tok.decode(self.ids[self.prefix_offset :])
        self.read_offset = len(self.ids)
        return full_text[len(prefix_text) :]


class StopStringFilter:
    """Holds back text that might be the start of a stop string; reports when one completes.

    feed() returns (text safe to emit, stopped). After a stop, the stop string and anything after it
    are dropped.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self.stops = tuple(s for s in stop_strings if s)
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        buf = self.pending + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.pending = ""
            return buf[: min(hits)], True
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        self.pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
