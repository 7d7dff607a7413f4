"""The config's tools_time_zone: an unknown zone stops the load naming the key; the shipped time tool answers in the
configured zone when a call names none, and a call's own time_zone still wins. The clock is frozen at one instant."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from llm_engine.tool_format import ToolCall
from parley.config import DEFAULT_CONFIG, ConfigError, Persona, load_config
from parley.runtime import persona_tools
from voice import builtin_tools

INSTANT = datetime(2026, 12, 5, 7, 30, tzinfo=timezone.utc)


class FrozenDatetime(datetime):
    @classmethod
    def now(cls, tz=None):  # type: ignore[no-untyped-def, override]
        return INSTANT.astimezone(tz) if tz is not None else INSTANT.replace(tzinfo=None)


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtin_tools, "datetime", FrozenDatetime)


def expected(zone: str) -> str:
    return INSTANT.astimezone(ZoneInfo(zone)).strftime("%A %d %B %Y, %H:%M %Z")


def test_an_unknown_zone_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"tools_time_zone: .*unknown time zone 'Mars/Olympus'"):
        load_config(DEFAULT_CONFIG, ["tools_time_zone=Mars/Olympus"])
    assert load_config(DEFAULT_CONFIG).tools_time_zone == ""  # shipped: the server's own zone


def test_the_time_tool_answers_in_the_configured_zone(frozen: None) -> None:
    cfg = load_config(DEFAULT_CONFIG, ["tools_time_zone=Asia/Kathmandu"])
    persona = Persona(name="p", display_name="P", system_prompt="Hi.", voice="joe", tools=("default",))
    (time_tool, *_), _ = persona_tools("p", persona, time_zone=cfg.tools_time_zone)
    assert time_tool.fn() == expected("Asia/Kathmandu") == "Saturday 05 December 2026, 13:15 +0545"
    assert time_tool.fn(time_zone="America/New_York") == expected("America/New_York")  # the call's own zone wins
    with pytest.raises(ValueError, match="Nowhere/City"):
        time_tool.fn(time_zone="Nowhere/City")
    result = asyncio.run(_run(time_tool))  # through the tool box, as a voice turn runs it
    assert result.ok and result.content == expected("Asia/Kathmandu")


def test_the_schema_is_the_same_and_no_zone_is_the_server_s(frozen: None) -> None:
    plain = persona_tools("p", Persona(name="p", display_name="P", system_prompt="Hi.", voice="joe", tools=("default",)))[0][0]
    zoned = persona_tools("p", Persona(name="p", display_name="P", system_prompt="Hi.", voice="joe", tools=("default",)),
                          time_zone="Europe/Paris")[0][0]  # fmt: skip
    assert plain.fn is builtin_tools.current_time and zoned.spec == plain.spec
    assert zoned.fn() == expected("Europe/Paris") != expected("Asia/Kathmandu")


async def _run(tool):  # type: ignore[no-untyped-def]
    from voice.tool_registry import ToolBox

    return await ToolBox([tool]).run(ToolCall("c1", tool.spec.name, "{}"))


def test_the_runtime_s_personas_carry_the_configured_zone(frozen: None) -> None:
    """parley.runtime.personas (what sessions use) hands the config's zone to every persona's time tool."""
    from parley.runtime import personas
    from parley.tool_offer import ToolSupport

    cfg = load_config(DEFAULT_CONFIG, ["tools_time_zone=Asia/Kathmandu"])
    specs = personas(cfg, ToolSupport(True, "a model that calls tools"))  # tools: auto then offers the shipped ones
    clocks = [t for spec in specs.values() for t in spec.tools if t.spec.name == "current_time"]
    assert clocks and all(t.fn() == expected("Asia/Kathmandu") for t in clocks)
