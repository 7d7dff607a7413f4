"""Random JSON schemas of the kinds tools take, and a validator for exactly that subset (jsonschema is not a
dependency): shared by the constrained-decoding and tool-call tests."""
from __future__ import annotations

import random
from typing import Any

ESCAPED = ['quote " inside', "back\\slash", "new\nline", "tab\there", "unicode é ✓", "plain"]


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A random schema of the kinds tools use: objects (nested), enums (with escapes), arrays, numbers, strings."""
    kinds = ["string", "integer", "number", "boolean", "enum", "array"] + (["object"] * 2 if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "object":
        props = {f"k{i}_{rng.choice(['a', 'b', 'q'])}": random_schema(rng, depth + 1) for i in range(rng.randint(1, 4))}
        required = [k for k in props if rng.random() < 0.7]
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    if kind == "enum":
        return {"enum": rng.sample(ESCAPED, rng.randint(1, 4))}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 12)}
    if kind == "integer":
        return {"type": "integer", "minimum": -50, "maximum": rng.randint(0, 1000)}
    if kind == "number":  # bounded, a multiple of 1/4: else a random model writes digits until max_tokens
        return {"type": "number", "minimum": -1000.5, "maximum": float(rng.randint(0, 10**6)), "multipleOf": 0.25}
    return {"type": kind}


def validate(value: Any, schema: dict[str, Any], path: str = "$") -> None:
    """The subset of JSON Schema random_schema writes, bounds optional (jsonschema is not a dependency)."""
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in enum"
        return
    kind = schema["type"]
    checks = {"string": str, "boolean": bool, "array": list, "object": dict}
    if kind in checks:
        assert isinstance(value, checks[kind]), f"{path}: {value!r} is not {kind}"
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{path}: {value!r} is not an integer"
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), f"{path}: {value} out of range"
    elif kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{path}: {value!r} is not a number"
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), f"{path}: {value} out of range"
        assert "multipleOf" not in schema or (value / schema["multipleOf"]) % 1 == 0, f"{path}: {value} not a multiple"
    if kind == "string":
        assert len(value) <= schema.get("maxLength", len(value)), f"{path}: {value!r} too long"
    if kind == "array":
        assert len(value) <= schema.get("maxItems", len(value)), f"{path}: too many items"
        for i, item in enumerate(value):
            validate(item, schema["items"], f"{path}[{i}]")
    if kind == "object":
        required = set(schema.get("required", ()))
        assert required <= set(value), f"{path}: missing {required - set(value)}"
        assert set(value) <= set(schema["properties"]), f"{path}: extra {set(value) - set(schema['properties'])}"
        for k, v in value.items():
            validate(v, schema["properties"][k], f"{path}.{k}")


def random_object(rng: random.Random) -> dict[str, Any]:
    """A tool's parameters: always an object at the top."""
    while True:
        schema = random_schema(rng)
        if schema.get("type") == "object":
            return schema


def unbounded(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema without maxItems / maxLength: strings and arrays a model may write until its token limit."""
    out = {k: v for k, v in schema.items() if k not in ("maxItems", "maxLength")}
    if "items" in out:
        out["items"] = unbounded(out["items"])
    if "properties" in out:
        out["properties"] = {k: unbounded(v) for k, v in out["properties"].items()}
    return out
