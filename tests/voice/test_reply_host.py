"""voice.replies knows its session only as voice.reply_host.ReplyHost (so the two modules do not import each other):
what the replies use of it is declared there, and voice.session's Session has all of it. Read from the sources, so a
use added on either side without the other fails here rather than at the first reply."""
from __future__ import annotations

import ast
import inspect

from voice import replies, reply_host, session


def _class(module: object, name: str) -> ast.ClassDef:
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _used_by_replies() -> set[str]:
    """Attributes read from `self.s` or from `s` (the replies' name for it)."""
    used = set()
    for node in ast.walk(ast.parse(inspect.getsource(replies))):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "s") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "s" and isinstance(owner.value, ast.Name)
                    and owner.value.id == "self"):  # fmt: skip
                used.add(node.attr)
    return used


def _declared(cls: ast.ClassDef) -> set[str]:
    """Names a class defines: methods, properties, annotated fields, and `self.x = ...` in its methods."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for node in ast.walk(cls):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    names.add(target.attr)
    return names


def test_what_the_replies_use_of_their_session_is_declared_and_the_session_has_it() -> None:
    host = _declared(_class(reply_host, "ReplyHost"))
    used = _used_by_replies()
    assert used, "found no use of the session in voice/replies.py: the reading above is wrong"
    assert used <= host, f"voice/replies.py uses {sorted(used - host)} of its session; declare them in ReplyHost"
    missing = host - _declared(_class(session, "Session"))
    assert not missing, f"ReplyHost declares {sorted(missing)}, which Session lacks"
