"""Conversations in a real database (storage.url): SQLite by default, PostgreSQL where several front ends share them,
through SQLAlchemy Core. A voice.conversation.ConversationStore: each history change appended as a row, each
conversation's persona, voice and turn counter, and its resume token (hashed), so a restarted server resumes it.

A conversation that ends keeps its transcript (`listing`, `transcript`: GET /api/conversations) until the user
forgets it (DELETE). Writes never block a turn: they go to a queue that one writer thread drains in batches (a
transaction each); a database that is down or full is logged and the batch dropped, never raised into a reply. Reads
(resuming, listing) wait for the writes before them. The tables are made at first use, so a server starts while its
database is still coming up.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from voice.conversation import ConversationStore, Listed, MemoryStore, Saved, TurnSummary, listed
from voice.facts import MAX_FACT_CHARS, MAX_FACTS, Fact
from voice.history import Added, Change, Message, Removed, Replaced, Summarised, transcript

log = logging.getLogger(__name__)
BATCH = 256  # writes a transaction takes at most


@dataclass(frozen=True)
class SavedToken:
    conversation_id: str
    auth_hash: str
    deadline_s: float | None  # wall-clock time (it must outlive the process); None: its connection was up


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class SqlStore:
    def __init__(self, url: str) -> None:
        import sqlalchemy as sa  # lazy: only a server that stores conversations loads it

        self._sa = sa
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        self.shown_url = self.engine.url.render_as_string(hide_password=True)
        meta = sa.MetaData()
        self.conversations = sa.Table(
            "conversations", meta,
            sa.Column("id", sa.String(64), primary_key=True),
            sa.Column("persona", sa.String(100), nullable=False),
            sa.Column("voice", sa.String(100)),
            sa.Column("last_turn", sa.Integer, nullable=False, default=0),
            sa.Column("started_s", sa.Float),
            sa.Column("updated_s", sa.Float, nullable=False, index=True),
            sa.Column("ended_s", sa.Float),  # null while open (carried, or held for a reconnect)
        )  # fmt: skip
        self.changes = sa.Table(
            "changes", meta,
            sa.Column("conversation_id", sa.String(64), primary_key=True),
            sa.Column("seq", sa.Integer, primary_key=True),
            sa.Column("kind", sa.String(8), nullable=False),  # add | replace | remove | summary
            sa.Column("role", sa.String(16)),
            sa.Column("content", sa.Text),
            sa.Column("a", sa.Integer),  # replace: the index; remove: start
            sa.Column("b", sa.Integer),  # remove: stop
        )  # fmt: skip
        self.tokens = sa.Table(
            "resume_tokens", meta,
            sa.Column("token_hash", sa.String(64), primary_key=True),
            sa.Column("conversation_id", sa.String(64), nullable=False, index=True),
            sa.Column("auth_hash", sa.String(64), nullable=False),
            sa.Column("deadline_s", sa.Float),
        )  # fmt: skip
        self.turns_table = sa.Table(
            "turns", meta,
            sa.Column("conversation_id", sa.String(64), primary_key=True),
            sa.Column("turn_id", sa.Integer, primary_key=True),
            sa.Column("at_s", sa.Float, nullable=False),
            sa.Column("input", sa.String(16)),
            sa.Column("voice_to_voice_ms", sa.Float),
            sa.Column("llm_ttft_ms", sa.Float),
            sa.Column("over_budget", sa.String(200)),  # stage names, comma-separated
        )  # fmt: skip
        self.facts_table = sa.Table(
            "user_facts", meta,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("owner", sa.String(64), nullable=False, index=True),  # the user's id under its auth token, hashed
            sa.Column("text", sa.String(MAX_FACT_CHARS * 2), nullable=False),
            sa.Column("created_s", sa.Float),
        )  # fmt: skip
        self._meta = meta
        self._schema_ready = False  # the tables are made at first use (not here: a server starts with its database down)
        self._schema_lock = threading.Lock()
        self._seq: dict[str, int] = {}  # conversation -> its next change's number (known once loaded or written)
        self._writes: queue.Queue[Callable[[Any], None] | None] = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0
        self._writer = threading.Thread(target=self._write_loop, name="parley-db-writer", daemon=True)
        self._writer.start()

    # -- ConversationStore --------------------------------------------------------------------------------

    def append(self, conversation_id: str, change: Change) -> None:
        seq = self._seq.get(conversation_id, 0)  # a new conversation has no rows; a resumed one was loaded first
        self._seq[conversation_id] = seq + 1
        row = {"conversation_id": conversation_id, "seq": seq, **_columns(change)}
        self._put(lambda c: c.execute(self.changes.insert(), row))

    def load(self, conversation_id: str) -> Sequence[Change]:
        ch = self.changes
        with self._reading() as c:
            changes = self._changes(c, conversation_id)
            last = c.execute(self._sa.select(self._sa.func.max(ch.c.seq)).where(ch.c.conversation_id == conversation_id)).scalar()
        self._seq[conversation_id] = 0 if last is None else last + 1  # after the last row (a dropped write leaves a gap)
        return changes

    def end(self, conversation_id: str) -> None:
        t, sa, now = self.conversations, self._sa, time.time()

        def ended(c: Any) -> None:
            c.execute(sa.update(t).where(t.c.id == conversation_id).values(ended_s=now, updated_s=now))
            c.execute(sa.delete(self.tokens).where(self.tokens.c.conversation_id == conversation_id))

        self._put(ended)

    def listing(self, limit: int) -> Sequence[Listed]:
        t = self.conversations
        with self._reading() as c:
            rows = c.execute(self._sa.select(t).order_by(t.c.updated_s.desc()).limit(limit)).all()
            return [listed(r.id, Saved(r.persona, r.voice, r.last_turn), transcript(self._changes(c, r.id)),
                            started_s=r.started_s, updated_s=r.updated_s, ended_s=r.ended_s) for r in rows]  # fmt: skip

    def transcript(self, conversation_id: str) -> Sequence[Message] | None:
        t = self.conversations
        with self._reading() as c:
            if c.execute(self._sa.select(t.c.id).where(t.c.id == conversation_id)).first() is None:
                return None
            return transcript(self._changes(c, conversation_id))

    def _changes(self, c: Any, conversation_id: str) -> tuple[Change, ...]:
        ch = self.changes
        rows = c.execute(self._sa.select(ch).where(ch.c.conversation_id == conversation_id).order_by(ch.c.seq)).all()
        return tuple(_change(r) for r in rows)

    def forget(self, conversation_id: str) -> None:
        self._seq.pop(conversation_id, None)
        sa = self._sa

        def delete(c: Any) -> None:
            for table in (self.changes, self.tokens, self.turns_table):
                c.execute(sa.delete(table).where(table.c.conversation_id == conversation_id))
            c.execute(sa.delete(self.conversations).where(self.conversations.c.id == conversation_id))

        self._put(delete)

    # -- its own state and its token ---------------------------------------------------------------------------

    def save(self, conversation_id: str, state: Saved) -> None:
        now = time.time()
        values = {"persona": state.persona, "voice": state.voice, "last_turn": state.last_turn, "updated_s": now}

        def upsert(c: Any) -> None:
            t = self.conversations
            if c.execute(self._sa.update(t).where(t.c.id == conversation_id).values(**values)).rowcount == 0:
                c.execute(t.insert().values(id=conversation_id, started_s=now, **values))

        self._put(upsert)

    def saved(self, conversation_id: str) -> Saved | None:
        t = self.conversations
        with self._reading() as c:
            row = c.execute(self._sa.select(t).where(t.c.id == conversation_id)).first()
        return None if row is None else Saved(row.persona, row.voice, row.last_turn)

    def save_token(self, token: str, conversation_id: str, auth: str, deadline_s: float | None) -> None:
        t, sa = self.tokens, self._sa

        def replace(c: Any) -> None:
            c.execute(sa.delete(t).where(t.c.conversation_id == conversation_id))
            c.execute(t.insert().values(token_hash=digest(token), conversation_id=conversation_id, auth_hash=digest(auth),
                                        deadline_s=deadline_s))  # fmt: skip

        self._put(replace)

    def hold_token(self, conversation_id: str, deadline_s: float) -> None:
        t = self.tokens
        self._put(lambda c: c.execute(self._sa.update(t).where(t.c.conversation_id == conversation_id).values(deadline_s=deadline_s)))

    def hold_orphans(self, deadline_s: float) -> None:
        """At start: tokens whose connection was up when the last process ended (a crash, a kill) count as dropped
        now."""
        t = self.tokens
        self._put(lambda c: c.execute(self._sa.update(t).where(t.c.deadline_s.is_(None)).values(deadline_s=deadline_s)))

    def find_token(self, token: str) -> SavedToken | None:
        t = self.tokens
        with self._reading() as c:
            row = c.execute(self._sa.select(t).where(t.c.token_hash == digest(token))).first()
        return None if row is None else SavedToken(row.conversation_id, row.auth_hash, row.deadline_s)

    # -- its turns' summaries -----------------------------------------------------------------------------------

    def record_turn(self, conversation_id: str, turn: TurnSummary) -> None:
        row = {"conversation_id": conversation_id, "turn_id": turn.turn_id, "at_s": turn.at_s, "input": turn.input[:16],
               "voice_to_voice_ms": turn.voice_to_voice_ms, "llm_ttft_ms": turn.llm_ttft_ms,
               "over_budget": ",".join(turn.over_budget)[:200]}  # fmt: skip
        t, sa = self.turns_table, self._sa

        def upsert(c: Any) -> None:  # a turn id again (a joined request's reply): the later trace
            c.execute(sa.delete(t).where(t.c.conversation_id == conversation_id, t.c.turn_id == turn.turn_id))
            c.execute(t.insert().values(**row))

        self._put(upsert)

    def turns(self, conversation_id: str) -> Sequence[TurnSummary]:
        t = self.turns_table
        with self._reading() as c:
            rows = c.execute(self._sa.select(t).where(t.c.conversation_id == conversation_id).order_by(t.c.turn_id)).all()
        return tuple(TurnSummary(r.turn_id, r.at_s, r.input or "", r.voice_to_voice_ms, r.llm_ttft_ms,
                                 tuple(x for x in (r.over_budget or "").split(",") if x)) for r in rows)  # fmt: skip

    # -- users' facts (voice.user_memory) ----------------------------------------------------------------------

    def facts(self, owner: str) -> Sequence[Fact]:
        t = self.facts_table
        with self._reading() as c:
            rows = c.execute(self._sa.select(t.c.id, t.c.text).where(t.c.owner == owner).order_by(t.c.id)).all()
        return tuple(Fact(r.id, r.text) for r in rows)

    def remember(self, owner: str, text: str) -> None:
        t, sa, now = self.facts_table, self._sa, time.time()

        def insert(c: Any) -> None:  # past MAX_FACTS the oldest go
            c.execute(t.insert().values(owner=owner, text=text, created_s=now))
            keep = sa.select(t.c.id).where(t.c.owner == owner).order_by(t.c.id.desc()).limit(MAX_FACTS)
            c.execute(sa.delete(t).where(t.c.owner == owner, t.c.id.not_in(keep.scalar_subquery())))

        self._put(insert)

    def forget_facts(self, owner: str, ids: Sequence[int]) -> None:
        t, gone = self.facts_table, list(ids)
        self._put(lambda c: c.execute(self._sa.delete(t).where(t.c.owner == owner, t.c.id.in_(gone))))

    # -- the database ----------------------------------------------------------------------------------------

    def ready(self) -> None:
        """The tables exist (made now if not): raises what the database says when it cannot be reached."""
        with self._schema_lock:
            if not self._schema_ready:
                self._meta.create_all(self.engine)
                self._add_missing_columns()
                self._schema_ready = True

    def _add_missing_columns(self) -> None:
        """A database an older Parley made: the columns this one added since are added to it (each nullable), so an
        upgrade keeps its conversations."""
        sa = self._sa
        have = sa.inspect(self.engine)
        with self.engine.begin() as c:
            for table in self._meta.sorted_tables:
                known = {col["name"] for col in have.get_columns(table.name)}
                for col in table.columns:
                    if col.name not in known:
                        kind = col.type.compile(dialect=self.engine.dialect)
                        c.execute(sa.text(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}'))
                        log.info("conversation store: added column %s.%s", table.name, col.name)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Any]:
        """A connection that sees every write queued before it."""
        self.flush()
        self.ready()
        with self.engine.connect() as c:
            yield c

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every write queued so far is done (or given up). -> whether it drained in time."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def close(self) -> None:
        self.flush()
        self._writes.put(None)
        self._writer.join(timeout=10)
        self.engine.dispose()

    def _put(self, write: Callable[[Any], None]) -> None:
        with self._idle:
            self._pending += 1
        self._writes.put(write)

    def _write_loop(self) -> None:
        while (first := self._writes.get()) is not None:
            batch = [first]
            while len(batch) < BATCH:
                try:
                    nxt = self._writes.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._writes.put(None)
                    break
                batch.append(nxt)
            try:
                self.ready()
                with self.engine.begin() as c:
                    for write in batch:
                        write(c)
            except Exception as exc:  # a database that is down, full or locked: logged, never a lost reply
                log.error("conversation store %s: %d writes dropped: %r", self.shown_url, len(batch), exc)
            with self._idle:
                self._pending -= len(batch)
                self._idle.notify_all()


def _columns(change: Change) -> dict[str, Any]:
    if isinstance(change, Added):
        return {"kind": "add", "role": change.role, "content": change.content, "a": None, "b": None}
    if isinstance(change, Replaced):
        return {"kind": "replace", "role": None, "content": change.content, "a": change.index, "b": None}
    if isinstance(change, Summarised):
        return {"kind": "summary", "role": None, "content": change.text, "a": change.stop, "b": None}
    return {"kind": "remove", "role": None, "content": None, "a": change.start, "b": change.stop}


def _change(row: Any) -> Change:
    if row.kind == "add":
        return Added(row.role, row.content)
    if row.kind == "replace":
        return Replaced(row.a, row.content)
    if row.kind == "summary":
        return Summarised(row.a, row.content)
    return Removed(row.a, row.b)


def open_store(url: str) -> ConversationStore:
    """storage.url -> its store: "memory", "default" (SQLite in the user's data directory) or a SQLAlchemy URL."""
    if url == "memory":
        return MemoryStore()
    if url == "default":
        from pathlib import Path

        from platformdirs import user_data_dir

        folder = Path(user_data_dir("parley"))
        folder.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{folder / 'conversations.db'}"
    try:
        return SqlStore(url)
    except Exception as exc:  # a wrong URL, a missing driver: one clear error at start (no password in it)
        from parley.config import ConfigError

        shown = re.sub(r"://([^:/@]*):[^@/]*@", r"://\1:***@", url)
        raise ConfigError(f"storage.url {shown!r}: {exc.__class__.__name__}: {str(exc).splitlines()[0][:200]}") from None
