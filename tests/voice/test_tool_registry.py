"""Server-side tools: the schema read from a function's signature and docstring, module:function loading, the shipped
tools, and running a call (a value, a raise, a timeout, a cancel, an unknown name: each a result or a clean cancel)."""
from __future__ import annotations

import asyncio
import json
import threading
from typing import Literal

import pytest

from llm_engine.constrain import json_schema_grammar
from llm_engine.tool_format import ToolCall
from voice.builtin_tools import calculate, current_time
from voice.tool_registry import ToolBox, load, schema_of, tool_from


def weather(city: str, days: int = 1, unit: Literal["C", "F"] = "C", hourly: bool | None = None, tags: list[str] | None = None) -> str:
    """The forecast for a city.

    More text that is not the description.

    city: the city's name
    days: how many days ahead
    """
    return f"{city} {days} {unit}"


def test_the_schema_comes_from_the_signature_and_the_docstring():
    description, schema = schema_of(weather)
    assert description == "The forecast for a city."
    assert schema["required"] == ["city"] and schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["city"] == {"type": "string", "description": "the city's name"}
    assert props["days"] == {"type": "integer", "description": "how many days ahead"}
    assert props["unit"] == {"enum": ["C", "F"]} and props["hourly"] == {"type": "boolean"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    json_schema_grammar(schema)  # and the grammar library compiles it


def test_a_parameter_type_with_no_schema_is_refused_by_name():
    def bad(when: object) -> str:
        return ""

    with pytest.raises(TypeError, match=r"bad\(when\)"):
        schema_of(bad)


def test_module_function_references_load_or_say_what_is_wrong():
    assert load("voice.builtin_tools:current_time").spec.name == "current_time"
    for ref, words in [("voice.builtin_tools", "module:function"), ("voice.nowhere:f", "No module"),
                       ("voice.builtin_tools:nothing", "nothing"), ("voice.builtin_tools:MAX_EXPONENT", "not a function")]:  # fmt: skip
        with pytest.raises(ValueError, match=words):
            load(ref)


def test_the_shipped_tools():
    assert calculate("(12 + 3) * 4") == "60" and calculate("7 / 2") == "3.5" and calculate("2 ^ 10") == "1024"
    for bad in ["__import__('os')", "2 ** 1000", "1 +", "a * 2"]:
        with pytest.raises(ValueError):
            calculate(bad)
    assert "2" in current_time("UTC") and current_time()
    with pytest.raises(ValueError, match="unknown time zone"):
        current_time("Mars/Olympus")


async def test_running_calls_gives_results_errors_and_timeouts():
    release = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "late"

    async def forever() -> str:
        await asyncio.Event().wait()
        return ""

    box = ToolBox([tool_from(weather), tool_from(calculate), tool_from(slow, timeout_s=0.05), tool_from(forever)])
    ok = await box.run(ToolCall("1", "weather", json.dumps({"city": "Oslo", "days": 2})))
    assert ok.ok and ok.content == "Oslo 2 C" and ok.ms >= 0
    raised = await box.run(ToolCall("2", "calculate", json.dumps({"expression": "1 / 0"})))
    assert not raised.ok and raised.content.startswith("error: ZeroDivisionError")
    timed_out = await box.run(ToolCall("3", "slow", "{}"))
    release.set()
    assert not timed_out.ok and "did not answer within 0.05 s" in timed_out.content
    unknown = await box.run(ToolCall("4", "nope", "{}"))
    assert not unknown.ok and "no tool named nope" in unknown.content
    wrong_args = await box.run(ToolCall("5", "weather", json.dumps({"town": "Oslo"})))
    assert not wrong_args.ok and "TypeError" in wrong_args.content
    task = asyncio.create_task(box.run(ToolCall("6", "forever", "{}")))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
