"""One launcher of a real `parley` server process (serve, stages) for the tests and the benchmarks:
bench/parley_process.py. Every other file under tests/ and bench/ is read for a second way in: the command's module
named anywhere, or a child process started with a `parley` or `uvicorn` command."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from test_layers import _parse

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path("bench/parley_process.py")
COMMAND_MODULE = "cli" + ".main"  # spelled apart so this file does not name it
EXEMPT = {  # one-shot commands, no server: nothing the launcher (a server on a port, until stopped) stands in for
    Path("tests/packaging/test_wheel.py"): "the installed wheel's `parley models` and `--help`, outside the checkout",
    Path("tests/client/test_desktop.py"): "`parley client` over a fake sound card, exiting with one line",
}
SPAWNERS = {"Popen", "run", "call", "check_call", "check_output", "create_subprocess_exec", "create_subprocess_shell",
            "system", "spawnv", "execv", "execvp"}  # fmt: skip


def _launches(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, what) for each way the tree starts a parley process."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and COMMAND_MODULE in node.value:
            yield node.lineno, f"names {COMMAND_MODULE}"
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name not in SPAWNERS:
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            for leaf in ast.walk(arg):
                if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
                    words = leaf.value.replace("/", " ").split()
                    if "parley" in words or "uvicorn" in words:
                        yield node.lineno, f"{name}() of {leaf.value!r}"


def test_tests_and_benchmarks_start_parley_through_the_one_launcher() -> None:
    found = []
    for folder in ("tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel in (LAUNCHER, *EXEMPT):
                continue
            found += [f"{rel}:{line}: {what}" for line, what in _launches(_parse(path))]
    assert not found, f"a second way to start parley (use {LAUNCHER}'s ParleyProcess):\n" + "\n".join(found)


def test_the_launcher_is_found_by_the_check_and_so_is_a_second_one() -> None:
    assert list(_launches(_parse(ROOT / LAUNCHER))), "the check does not see the launcher itself"
    second = ast.parse(
        "import subprocess, sys, asyncio\n"
        f"subprocess.Popen([sys.executable, '-m', '{COMMAND_MODULE}', 'serve'])\n"
        "asyncio.create_subprocess_exec('parley', 'stages', '--only', 'llm')\n"
        "subprocess.run(['uvicorn', 'web.app:app'])\n"
        "subprocess.run(['parecord', '--file-format=wav'])\n"  # not parley: not reported
    )  # fmt: skip
    assert sorted(line for line, _ in _launches(second)) == [2, 3, 4]
