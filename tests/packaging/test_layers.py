"""The layers of docs/architecture.md, checked on the code: every import between our packages points down the
order below, and no module imports itself back through a chain of others. Imports inside functions and those made
for type checking only count too: they are the same dependency, made later."""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("cli", "desktop", "web", "parley", "voice", "llm_engine")  # top to bottom: each imports only those after it


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the layered packages."""
    found = {}
    for pkg in LAYERS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(tree: ast.AST, modules: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, module) for each of our modules the tree imports; `from a import b` names a.b when that is a module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            targets = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue  # the packages use absolute imports only; a relative one stays inside its package
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                yield node.lineno, target


def _graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: the line of the first such import}."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, {})
        for line, target in _imported(ast.parse(path.read_text(), str(path)), modules):
            if target != name:
                edges.setdefault(target, line)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
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


def test_every_import_points_down_the_layers() -> None:
    graph = _graph()
    upward = [
        f"{_modules()[src].relative_to(ROOT)}:{line}: {src} imports {dst}"
        for src, edges in graph.items()
        for dst, line in edges.items()
        if _layer(dst) < _layer(src)
    ]
    assert not upward, "imports that run back up (docs/architecture.md, The packages):\n" + "\n".join(upward)


def test_no_module_imports_itself_back() -> None:
    circles = _cycles(_graph())
    assert not circles, "modules that import each other back (put the shared piece where both can import it):\n" + "\n".join(
        " ↔ ".join(group) for group in circles)


def test_the_checker_finds_a_circle_and_an_upward_import() -> None:
    """The checks above on a made-up graph: they would fail if the code had either."""
    graph = {"voice.a": {"voice.b": 1}, "voice.b": {"voice.c": 1}, "voice.c": {"voice.a": 1, "web.x": 1}, "web.x": {}}
    assert _cycles(graph) == [["voice.a", "voice.b", "voice.c"]]
    assert [dst for dst in graph["voice.c"] if _layer(dst) < _layer("voice.c")] == ["web.x"]


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
