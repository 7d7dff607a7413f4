"""Which tools a persona is offered (parley.tool_offer): under the shipped config (`tools: auto`) the default persona
gets the shipped tools on tiny random Qwen2.5- and Llama 3.1-style GGUFs whose templates render tools, and none on
the embedded SmolLM2 or on a template without tools; an explicit list and an explicit [] are honoured on any model."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import tiny_gguf as tg
import yaml
from test_tool_calls import QWEN_TOOLS_TEMPLATE

from llm_engine.engine import Engine
from parley.config import DEFAULT_CONFIG, load_config
from parley.runtime import personas
from parley.tool_offer import NOT_LOADED, llm_tool_support
from voice.llm_bridge import LlmBridge

DEFAULT_TOOLS = ["current_time", "calculate", "set_timer"]

# Llama 3.1's way, in a template of our own writing: the tools as JSON in a system turn, a call as {name, parameters}
# (no `<tool_call>`: the engine writes our prompt format for it, llm_engine.tool_format)
LLAMA31_TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nYou may call a function by answering "
    "{\"name\": NAME, \"parameters\": ARGS}.\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|eot_id|>{% endif %}"
    "{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(autouse=True)
def _cache_root(tmp_path, monkeypatch):
    monkeypatch.setattr("llm_engine.gguf_loader.default_cache_root", lambda: tmp_path / "gguf-cache")


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory, smol_path):
    """-> make(family, tools template?) -> an Engine over a tiny random GGUF of that family, its template in the file."""
    from llm_engine.gguf_loader import prepare_gguf

    smol = prepare_gguf(smol_path)
    root = tmp_path_factory.mktemp("tool-offer")

    def make(family: str, with_tools: bool) -> Engine:
        tok = tg.tokenizer_for(family, smol)
        if with_tools:
            tok.chat_template = QWEN_TOOLS_TEMPLATE if family == "qwen2" else LLAMA31_TOOLS_TEMPLATE
        folder = root / f"{family}-{with_tools}"
        hf = tg.build_hf(family, folder / "hf", tok)
        return Engine.from_path(tg.write_gguf(hf, folder / "F32.gguf", family), max_seq_len=512, max_slots=1, native="off")

    return make


def config_with(root: Path, personas_more: dict[str, dict]) -> Path:
    """The shipped configs/ copied to `root`, each named persona's file with more keys."""
    shutil.copytree(DEFAULT_CONFIG.parent, root / "configs")
    for name, more in personas_more.items():
        file = root / "configs" / "personas" / f"{name}.yaml"
        file.write_text(yaml.safe_dump({**yaml.safe_load(file.read_text()), **more}))
    return root / "configs" / DEFAULT_CONFIG.name


def offered(support) -> dict[str, list[str]]:
    return {name: [t.spec.name for t in p.tools] for name, p in personas(load_config(DEFAULT_CONFIG), support).items()}


@pytest.mark.parametrize("family", ["qwen2", "llama3"])
def test_a_model_whose_template_renders_tools_gets_the_default_tools(tiny_engine, family, caplog) -> None:
    engine = tiny_engine(family, with_tools=True)
    support = llm_tool_support(LlmBridge(engine))
    assert support.can_call and "chat template renders tools" in support.why
    assert engine.tokenizer.renders_tools == (family == "qwen2")  # Llama 3.1's calls are not `<tool_call>`s
    cfg = load_config(DEFAULT_CONFIG)
    assert cfg.persona(None).tools == "auto"  # the shipped default persona states no list: the rule decides
    with caplog.at_level(logging.INFO, logger="parley.runtime"):
        specs = personas(cfg, support)
    assert [t.spec.name for t in specs[cfg.default_persona].tools] == DEFAULT_TOOLS
    assert f"persona {cfg.default_persona}: tools current_time, calculate, set_timer (tools: auto" in caplog.text


@pytest.mark.parametrize("family", ["qwen2", "llama3"])
def test_the_same_family_with_a_template_without_tools_gets_none(tiny_engine, family) -> None:
    support = llm_tool_support(LlmBridge(tiny_engine(family, with_tools=False)))
    assert not support.can_call and all(v == [] for v in offered(support).values())


@pytest.fixture(autouse=True)
def family_reset(tiny_engine):
    """Tests here set a tiny engine's family record; the next test gets the engine's own back."""
    engine = tiny_engine("qwen2", with_tools=True)
    family = engine.family
    yield
    engine.family = family


def test_a_model_measured_not_to_call_tools_gets_none_though_its_template_renders_them(tiny_engine) -> None:
    """A family whose record says bench.tools_default measured it not calling tools (calls_tools=False): its template
    renders tools, but `tools: auto` offers it none (a listed set still goes)."""
    from llm_engine.families import Family

    engine = tiny_engine("qwen2", with_tools=True)
    engine.family = Family("Silent 1B", 0.03, calls_tools=False)  # (the fixture's engine: put back by family_reset)
    support = llm_tool_support(LlmBridge(engine))
    assert not support.can_call and "Silent 1B was measured not to call them" in support.why
    assert all(v == [] for v in offered(support).values())


def test_the_qwen_models_get_the_tools_worded_as_each_calls_them_best_and_the_1_5b_gets_them_by_default(tiny_engine) -> None:
    """As bench.tools_default and a conversation measured them (llm_engine/families.py): the 1.5B is offered the
    default set under `tools: auto`, worded in our prompt format; the default 0.5B none (in a conversation it called
    none), but listed tools are worded in its template's own way, as it calls them best."""
    from llm_engine.families import family_of
    from llm_engine.tool_format import ToolSpec

    engine = tiny_engine("qwen2", with_tools=True)
    tools = [ToolSpec("current_time", "the time")]
    for size, offered_by_default, template in (("0.5B", False, True), ("1.5B", True, False)):
        engine.family = family_of("Qwen2.5-Coder", size)
        bridge = LlmBridge(engine)
        assert llm_tool_support(bridge).can_call == offered_by_default
        assert offered(llm_tool_support(bridge))["assistant"] == (DEFAULT_TOOLS if offered_by_default else [])
        worded = bridge.system_with_tools("Be brief.", tools)
        assert (worded == engine.tokenizer.system_with_tools("Be brief.", tools) is not None) if template else worded is None


def test_the_embedded_model_gets_none_and_the_reason_says_why(smol_engine) -> None:
    support = llm_tool_support(LlmBridge(smol_engine))
    assert not support.can_call and "does not render tools" in support.why
    specs = personas(load_config(DEFAULT_CONFIG), support)
    assert all(p.tools == () and "tools: auto, and the LLM's chat template does not render tools" in p.tools_why
               for p in specs.values())  # fmt: skip
    assert offered(NOT_LOADED) == {name: [] for name in specs}  # before the LLM is loaded, auto offers nothing yet


def test_an_explicit_list_and_an_explicit_empty_list_are_honoured(smol_engine, tiny_engine, tmp_path) -> None:
    """`tools: [default]` on the embedded model (which cannot choose them) still offers them; `tools: []` on a model
    that could call them offers none; a list of one offers that one."""
    path = config_with(tmp_path, {"assistant": {"tools": ["default"]}, "concise": {"tools": []},
                                  "storyteller": {"tools": ["voice.builtin_tools:calculate"]}})  # fmt: skip
    cfg = load_config(path)
    for llm in (LlmBridge(smol_engine), LlmBridge(tiny_engine("qwen2", with_tools=True))):
        specs = personas(cfg, llm_tool_support(llm))
        assert [t.spec.name for t in specs["assistant"].tools] == DEFAULT_TOOLS
        assert specs["concise"].tools == () and specs["concise"].tools_why == "tools: [] (none)"
        assert [t.spec.name for t in specs["storyteller"].tools] == ["calculate"]
        assert specs["storyteller"].tools_why == "listed in the persona's tools:"
