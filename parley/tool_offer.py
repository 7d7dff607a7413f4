"""Which tools a persona's replies are offered, and why: `tools: auto` (the default) is the shipped set where the LLM
can call tools — a remote LLM (it takes `tools` natively) or a local model whose chat template renders them — and
none on a model without (the embedded SmolLM2); a listed set is offered as listed. Knows config and the LLM stage's
shape, not sessions. docs/tools.md, "Which tools a persona is offered".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parley.config import DEFAULT_TOOLS, Persona, PersonaTool


@dataclass(frozen=True)
class ToolSupport:
    """Whether the LLM this process talks to can call tools, in words a builder reads in the log."""

    can_call: bool
    why: str


NOT_LOADED = ToolSupport(False, "the LLM is not loaded yet")


def llm_tool_support(llm: Any) -> ToolSupport:
    """The LLM stage (voice.llm_bridge.LlmBridge over our engine, voice.remote.llm.RemoteLlm, or none) -> ToolSupport."""
    if getattr(llm, "native_tools", False):
        spec = getattr(llm, "spec", None)
        where = f" ({spec.base_url})" if spec is not None else ""
        return ToolSupport(True, f"the LLM is remote{where} and takes tools natively")
    tokenizer = getattr(getattr(llm, "engine", None), "tokenizer", None)
    if tokenizer is None:
        return ToolSupport(False, "this process runs no LLM of its own")
    family = getattr(getattr(llm, "engine", None), "family", None)
    if getattr(tokenizer, "template_lists_tools", False) and getattr(family, "calls_tools", None) is False:
        return ToolSupport(False, f"the LLM's chat template renders tools, but {family.name} was measured not to call "
                                  "them (llm_engine/families.py): list them under the persona's tools: to offer them anyway")  # fmt: skip
    if getattr(tokenizer, "template_lists_tools", False):
        return ToolSupport(True, "the LLM's chat template renders tools")
    return ToolSupport(False, "the LLM's chat template does not render tools (a model not trained to call them, as the "
                              "embedded SmolLM2-135M): list them under the persona's tools: to offer them anyway")  # fmt: skip


def offered_entries(p: Persona, support: ToolSupport) -> tuple[tuple[str | PersonaTool, ...], str]:
    """A persona's tool entries to load ("default" expanded) and why these: (entries, reason)."""
    if p.tools == "auto":
        return (DEFAULT_TOOLS if support.can_call else ()), f"tools: auto, and {support.why}"
    entries = tuple(e for entry in p.tools for e in (DEFAULT_TOOLS if entry == "default" else (entry,)))
    return entries, "listed in the persona's tools:" if entries else "tools: [] (none)"
