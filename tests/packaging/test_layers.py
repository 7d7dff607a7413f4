"""The layers of docs/architecture.md, checked on the code: every import between our packages points down the
order below, and no module imports itself back through a chain of others (inside one package or across them).
Imports inside functions, relative ones and those made for type checking only count too: they are the same
dependency, made later."""
from __future__ import annotations

import ast
import gc
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("cli", "desktop", "web", "parley", "voice", "llm_engine")  # top to bottom: each imports only those after it
UNSHIPPED = ("bench", "tests", "support")  # the checkout's drivers and test helpers: not in the wheel

Graph = dict[str, dict[str, int]]  # module -> {module it imports: the line of the first such import}


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the layered packages under `root`."""
    found = {}
    for pkg in LAYERS:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _parse(path: Path) -> ast.Module:
    """ast.parse with the collector off. On CPython before 3.11.8 (gh-106905) the AST builder's depth counter is
    process-wide: a collection in the middle of it can run a finalizer that parses too (an asyncio task's
    "exception was never retrieved" log formats a traceback, which calls ast.parse), and the outer parse then fails
    with `SystemError: AST constructor recursion depth mismatch`. Without a collection no Python code runs inside."""
    source = path.read_text()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, str(path))
    finally:
        if was_enabled:
            gc.enable()


def _imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, target) for each import in the tree of module `name`; `from a import b` names a.b when that is a known
    module, else a; a relative import is resolved against the module's package. Targets outside `known` are given
    by their first dotted part (`bench`, `numpy`)."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            found = target
            while found and found not in known:
                found = found.rpartition(".")[0]
            yield node.lineno, found or target.partition(".")[0]


def _graph(root: Path = ROOT) -> Graph:
    """Every import of the layered packages under `root`: module -> {target: line of its first import}."""
    modules = _modules(root)
    known = set(modules)
    graph: Graph = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, {})
        for line, target in _imported(_parse(path), name, path.name == "__init__.py", known):
            if target != name:
                edges.setdefault(target, line)
    return graph


def _ours(graph: Graph) -> Graph:
    """The graph between our own modules only."""
    return {src: {dst: line for dst, line in edges.items() if dst in graph} for src, edges in graph.items()}


def _cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def _layer(module: str) -> int:
    return LAYERS.index(module.partition(".")[0])


def _upward(graph: Graph) -> list[str]:
    """`src imports dst (line N)` for each import of a module in a higher layer."""
    return [f"{src}:{line}: imports {dst}" for src, edges in _ours(graph).items() for dst, line in edges.items()
            if _layer(dst) < _layer(src)]  # fmt: skip


def _unshipped(graph: Graph) -> list[str]:
    return [f"{src}:{line}: imports {dst}" for src, edges in graph.items() for dst, line in edges.items() if dst in UNSHIPPED]


def _narrow(graph: Graph) -> list[str]:
    """The doors docs/architecture.md names: desktop takes only the wire (web.protocol) from web and only the config
    (parley.config) from parley; only voice.llm_bridge imports the engine itself (the rest of voice takes its data
    shapes: requests, tool calls, constraints)."""
    doors = {("desktop", "web"): {"web.protocol"}, ("desktop", "parley"): {"parley.config"}}
    wrong = []
    for src, edges in _ours(graph).items():
        for dst, line in edges.items():
            allowed = doors.get((src.partition(".")[0], dst.partition(".")[0]))
            engine = dst == "llm_engine.engine" and src.startswith("voice.") and src != "voice.llm_bridge"
            if engine or (allowed is not None and dst not in allowed):
                wrong.append(f"{src}:{line}: imports {dst}")
    return wrong


def test_every_import_points_down_the_layers() -> None:
    upward = _upward(_graph())
    assert not upward, "imports that run back up (docs/architecture.md, The packages):\n" + "\n".join(upward)


def test_no_module_imports_itself_back() -> None:
    circles = _cycles(_ours(_graph()))
    assert not circles, "modules that import each other back (put the shared piece where both can import it):\n" + "\n".join(
        " ↔ ".join(group) for group in circles)


def test_the_shipped_packages_import_nothing_that_stays_in_the_checkout() -> None:
    wrong = _unshipped(_graph())
    assert not wrong, "the wheel does not carry bench/ or tests/:\n" + "\n".join(wrong)


def test_desktop_and_voice_go_through_the_doors_the_docs_name() -> None:
    wrong = _narrow(_graph())
    assert not wrong, "docs/architecture.md says these go through one door:\n" + "\n".join(wrong)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_checker_finds_upward_imports_circles_and_wrong_doors(tmp_path: Path) -> None:
    """The checks above on a made-up tree of files: each rule broken once, in the ways code hides it (inside a
    function, relative, for type checking only), is reported; the same tree without the breaks is clean."""
    clean = {
        **{f"{pkg}/__init__.py": "" for pkg in LAYERS},
        "web/app.py": "import parley.config\nfrom voice import a\n",
        "voice/a.py": "from . import b\nimport numpy\n",
        "voice/b.py": "from voice.c import X\n",
        "voice/c.py": "X = 1\n",
        "voice/llm_bridge.py": "from llm_engine.engine import Engine\n",
        "llm_engine/engine.py": "Engine = object\n",
        "desktop/app.py": "from web.protocol import pack\nfrom parley.config import AppConfig\n",
        "web/protocol.py": "pack = 1\n",
        "parley/config.py": "AppConfig = 1\n",
    }
    _write(tmp_path, clean)
    graph = _graph(tmp_path)
    assert graph["voice.a"] == {"voice.b": 1, "numpy": 2} and graph["desktop.app"] == {"web.protocol": 1, "parley.config": 2}
    assert not _upward(graph) and not _cycles(_ours(graph)) and not _unshipped(graph) and not _narrow(graph)

    _write(tmp_path, {
        "voice/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import Y\nX = 1\n",  # a ↔ b ↔ c
        "llm_engine/engine.py": "def later():\n    from web.protocol import pack\n",  # upward, inside a function
        "parley/config.py": "from ..cli import main\nimport bench.corpus\n",  # upward and relative; not shipped
        "desktop/app.py": "from web import app\n",  # desktop past the wire
        "voice/a.py": "from . import b\nimport llm_engine.engine\n",  # the engine, not through the bridge
    })  # fmt: skip
    graph = _graph(tmp_path)
    assert _upward(graph) == ["parley.config:1: imports cli", "llm_engine.engine:2: imports web.protocol"]
    assert _cycles(_ours(graph)) == [["voice.a", "voice.b", "voice.c"]]
    assert _unshipped(graph) == ["parley.config:2: imports bench"]
    assert sorted(_narrow(graph)) == ["desktop.app:1: imports web.app", "voice.a:2: imports llm_engine.engine"]


def test_the_docs_state_the_order_and_it_covers_every_package_that_ships() -> None:
    """The order tested here is the one docs/architecture.md states; the wheel (setup.py) and the image's dependency
    layer (deploy/Dockerfile, which installs before the sources come) hold exactly these packages."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert "`" + " → ".join(LAYERS) + "`" in doc
    shipped = re.findall(r'"(\w+)\*"', (ROOT / "setup.py").read_text())
    assert sorted(shipped) == sorted(LAYERS), "setup.py's packages are not the layered ones"
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for pkg in LAYERS:
        assert f"COPY {pkg}/__init__.py {pkg}/__init__.py" in dockerfile, f"deploy/Dockerfile does not install {pkg}/"
