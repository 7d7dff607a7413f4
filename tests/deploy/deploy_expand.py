"""Expanding a container's command as compose, Kubernetes and a POSIX shell would, for tests/deploy: variable
interpolation (with defaults and required values), `sh -c` word splitting, and the argv Parley finally gets."""
from __future__ import annotations

import re
from typing import Any


class ExpansionError(ValueError):
    pass


# -- expansion: compose, Kubernetes, sh ---------------------------------------------------------------------------

_COMPOSE_VAR = re.compile(r"\$\$|\$\{(\w+)(?:(:?)([-?])([^}]*))?\}|\$(\w+)")
_SH_VAR = re.compile(r"\$\{(\w+)(?:(:?)([-?=+])([^}]*))?\}|\$(\w+)")


def compose_interpolate(value: Any, host_env: dict[str, str]) -> Any:
    """What compose does to every string of the file: `$$` is a `$`, `${X:-d}` a default, `${X:?}` required."""
    if isinstance(value, dict):
        return {k: compose_interpolate(v, host_env) for k, v in value.items()}
    if isinstance(value, list):
        return [compose_interpolate(v, host_env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(5)
        colon, op, arg = m.group(2), m.group(3), m.group(4)
        val = host_env.get(name)
        missing = val is None or (colon == ":" and val == "")
        if op == "-":
            return arg if missing else val  # type: ignore[return-value]
        if op == "?":
            if missing:
                raise ExpansionError(f"compose: {name} is required ({arg}) and the test's host has no value for it")
            return val  # type: ignore[return-value]
        return val or ""

    return _COMPOSE_VAR.sub(one, value)


def k8s_expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' own expansion in command/args: `$(VAR)` from the container's env, `$$` a `$`."""
    return re.sub(r"\$\$|\$\((\w+)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def _sh_expand(m: re.Match[str], env: dict[str, str]) -> str:
    name = m.group(1) or m.group(5)
    colon, op, arg = m.group(2), m.group(3), m.group(4)
    val = env.get(name)
    missing = val is None or (colon == ":" and val == "")
    if op in ("-", "="):
        return arg if missing else val  # type: ignore[return-value]
    if op == "+":
        return "" if missing else arg
    if missing:
        # `${X:?}` stops the shell (the intent), a bare `$X` would be empty: either way the container lacks X
        raise ExpansionError(f"sh: ${name} is used but the container's environment does not set it")
    return val  # type: ignore[return-value]


def sh_words(script: str, env: dict[str, str]) -> list[str]:
    """A POSIX shell's words for a simple command line: quotes, backslashes and parameter expansion (not inside
    single quotes). Anything more (pipes, `;`, substitutions) is refused: the containers run one `exec`."""
    words: list[str] = []
    cur: list[str] = []
    have = False
    quote: str | None = None
    i = 0
    while i < len(script):
        c = script[i]
        if quote == "'":
            if c == "'":
                quote = None
            else:
                cur.append(c)
            i += 1
            continue
        if c == "\\" and i + 1 < len(script):
            nxt = script[i + 1]
            if quote == '"' and nxt not in '$`"\\\n':
                cur.append(c)
            cur.append(nxt)
            i, have = i + 2, True
            continue
        if c == "$":
            m = _SH_VAR.match(script, i)
            if m is None:
                raise ExpansionError(f"sh: unsupported `$` syntax at {script[i:i + 20]!r}")
            cur.append(_sh_expand(m, env))
            i, have = m.end(), True
            continue
        if quote == '"':
            if c == '"':
                quote = None
            else:
                cur.append(c)
            i += 1
            continue
        if c in "'\"":
            quote, have = c, True
        elif c.isspace():
            if cur or have:
                words.append("".join(cur))
            cur, have = [], False
        elif c in ";&|<>`()":
            raise ExpansionError(f"sh: unsupported syntax {c!r} in {script!r}")
        else:
            cur.append(c)
        i += 1
    if quote:
        raise ExpansionError(f"sh: unclosed {quote} in {script!r}")
    if cur or have:
        words.append("".join(cur))
    return words


def container_argv(argv: list[str], env: dict[str, str]) -> list[str]:
    """The process a container runs: through `sh -c` (with `exec`) when it uses one."""
    if argv[:2] in (["sh", "-c"], ["/bin/sh", "-c"]):
        words = sh_words(argv[2], env)
        assert words and words[0] == "exec", f"`sh -c` without `exec`: the shell, not Parley, gets SIGTERM: {argv[2]!r}"
        return words[1:]
    return list(argv)
