"""The test server's config: a copy of the shipped configs/ with short replies and test limits."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from parley.config import DEFAULT_CONFIG

TOKEN = "test-token"


def _merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def write_test_config(root: Path, vad: dict[str, Any] | None = None, more: dict[str, Any] | None = None,
                      **server: Any) -> Path:  # fmt: skip
    """configs/ copied to `root`, replies capped short (test runtime); VAD and barge-in settings as shipped unless
    `vad` overrides some; `server` overrides server keys; `more` is merged into the rest (e.g. models).
    The LLM is the embedded SmolLM2-135M unless `more` names another: these tests check what the server does with
    a reply, not what it says (the default model's answers are checked in tests/llm_engine/test_default_model.py),
    and the 135M keeps the suite's time on two cores."""
    dst = root / "configs"
    shutil.copytree(DEFAULT_CONFIG.parent, dst)
    for name in ("assistant", "concise"):
        path = dst / "personas" / f"{name}.yaml"
        data = yaml.safe_load(path.read_text())
        data["max_reply_tokens"] = 36 if name == "assistant" else 20
        path.write_text(yaml.safe_dump(data))
    data = yaml.safe_load((dst / "default.yaml").read_text())
    # resume_window_s 5: a dropped test client's conversation (and its engine slot) is not held for a minute
    data["server"].update({"port": 0, "trace_log": str(root / "traces.jsonl"), "token": TOKEN, "max_sessions": 4,
                           "idle_timeout_s": 30, "admit_max_wait_ms": 0, "admit_v2v_ratio": 0,
                           "resume_window_s": 5, **server})  # fmt: skip
    data["vad"].update(vad or {})
    data["storage"] = {"url": f"sqlite:///{root / 'conversations.db'}"}
    data["models"]["llm"]["source"] = "embedded-135m"
    _merge(data, more or {})
    (dst / "default.yaml").write_text(yaml.safe_dump(data))
    return dst / "default.yaml"
