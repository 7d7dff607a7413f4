"""Interruptions on a real server: sounds played into the microphone 0.6-1.0 s into a spoken reply, by a client that
plays the reply in real time, sends playback marks and follows the server's hold / resume / clear (no echo canceller
and no VAD of its own, like a speakerphone or a phone line). Per family: replies stopped, turns opened, and the time
from the interjection's first voiced sample to the server's decision and to the reply's resume.

    python -m bench.interruptions [--server URL] [--tiny] [--family F ...] [--repeat N] [--out FILE]

Families: backchannels ("uh-huh" ... in Piper, flite and espeak-ng voices), noises (a cough, a knock, babble and music
at -25 dBFS), echo (the reply's own audio fed back 60-120 ms later at -10 dB), real interruptions (stop words and
requests, one of them spoken over the echo). Targets and results: docs/benchmarks.md, docs/turn-taking.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from bench import corpus
from bench._server import start_server
from desktop.connection import Connection, ws_url
from web.protocol import PlaybackMark, unpack_audio

RATE = 16000
FRAME = RATE // 50  # 20 ms
STORY = "Tell me a long story about a brave knight who fights a dragon in the mountains."
BACKCHANNELS = ["Uh-huh.", "Mm-hmm.", "Yeah.", "Okay.", "Right.", "Got it."]
REAL = ["Wait, stop.", "No, tell me about Mars instead.", "Hold on, what did you just say?", "Actually, never mind."]
VOICES = ["piper", "flite", "espeak"]
ECHO_DB = -10.0
MARK_EVERY = 12  # frames: a playback mark every 240 ms while the reply plays, as the browser sends them
AFTER_S = 3.0  # how long the client keeps listening after the interjection (a real one: until its answer is heard out)


@dataclass(frozen=True)
class Case:
    family: str  # backchannel | noise | echo | real
    name: str
    audio: np.ndarray | None = field(repr=False)  # 16 kHz, what the user's side adds; None: echo only
    echo_ms: float | None = None  # the reply fed back this late at ECHO_DB; None: no echo


@dataclass
class Outcome:
    family: str
    name: str
    stopped: bool
    turns_opened: int
    decision_ms: float | None  # first voiced sample -> response.audio.clear (audio time, the server's clock)
    resume_ms: float | None  # first voiced sample -> response.resumed
    answered: str | None = None  # real: the transcript the new turn answered
    heard: str | None = None  # what the server heard in it: the resumed words, or the interrupting turn's transcript
    error: str | None = None
    speech_events: int = 0  # vad.speech_started seen (0: the server's VAD never heard it)


def _level(audio: np.ndarray, dbfs: float) -> np.ndarray:
    rms = float(np.sqrt(np.mean(np.square(audio)))) or 1.0
    return (audio * 10 ** (dbfs / 20) / rms).astype(np.float32)


def noises(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(RATE) / RATE
    cough = rng.standard_normal(int(0.25 * RATE)) * np.exp(-np.arange(int(0.25 * RATE)) / (0.05 * RATE))
    knock = np.zeros(int(0.6 * RATE))
    for at in (0.0, 0.18, 0.36):
        i = int(at * RATE)
        knock[i : i + 400] += np.sin(2 * np.pi * 180 * np.arange(400) / RATE) * np.exp(-np.arange(400) / 80)
    babble = sum(_level(corpus.speak(text, voice)[:RATE], -31.0)
                 for text, voice in [(corpus.REQUESTS[3], "flite"), (corpus.REQUESTS[8], "espeak"),
                                     (corpus.REQUESTS[12], "piper")])  # fmt: skip
    babble = np.pad(babble, (0, RATE - len(babble))) if len(babble) < RATE else babble
    music = sum(np.sin(2 * np.pi * f * t * (1 + 0.004 * np.sin(2 * np.pi * 5 * t))) for f in (262, 330, 392, 523))
    music *= 0.5 + 0.5 * (np.sin(2 * np.pi * 2 * t) > 0)  # a beat: notes on and off
    return {"cough": _level(cough, -12.0), "knock": _level(knock, -14.0), "babble": _level(babble, -25.0),
            "music": _level(music, -25.0)}  # fmt: skip


def cases(tiny: bool) -> list[Case]:
    out: list[Case] = []
    for text in BACKCHANNELS[2:3] if tiny else BACKCHANNELS:  # tiny: "Yeah."
        for voice in (["piper-steady"] if tiny else VOICES):
            out.append(Case("backchannel", f"{text} ({voice})", corpus.speak(text, voice)))
    for name, audio in noises().items():
        if not tiny or name == "music":
            out.append(Case("noise", name, audio))
    for delay in ([90.0] if tiny else [60.0, 90.0, 120.0]):
        out.append(Case("echo", f"own reply, {delay:.0f} ms later at {ECHO_DB:.0f} dB", None, delay))
    for text in REAL[:1] if tiny else REAL:
        for voice in (["flite"] if tiny else VOICES):
            out.append(Case("real", f"{text} ({voice})", corpus.speak(text, voice)))
    over, voice = REAL[1], "piper-steady" if tiny else "piper"
    out.append(Case("real", f"{over} ({voice}) over the echo", corpus.speak(over, voice), 90.0))
    return out


class Speakerphone:
    """One session: plays replies in real time into a loudspeaker its microphone hears (when `echo_ms` is set), says
    `case.audio` once the story's reply has played `inject_ms`, and follows the server's hold, resume and clear."""

    def __init__(self, server: str, case: Case, inject_ms: float, token: str | None = None) -> None:
        self.url, self.case, self.inject_ms, self.token = ws_url(server), case, inject_ms, token
        self.msgs: list[dict[str, Any]] = []
        self.audio: dict[int, list[np.ndarray]] = {}  # turn -> reply audio received, 16 kHz
        self.pos: dict[int, int] = {}  # turn -> samples played
        self.cleared: set[int] = set()
        self.held = False
        self.held_turn: int | None = None  # the reply whose playback the server held (vad.speech_started's `holds`)
        self.spoken: list[np.ndarray] = []  # what the loudspeaker played, frame by frame (the echo's source)
        self.rate = 22050
        self.story: int | None = None
        self.voiced_ms: float | None = None  # mic time of the interjection's first voiced sample
        self.frames = 0

    async def run(self) -> Outcome:
        conn = Connection(self.url, self.token, sample_rate=RATE, open_timeout_s=30.0)
        info = await conn.open(None, None)
        self.rate = info.output_sample_rate
        reader = asyncio.create_task(self._read(conn))
        try:
            await self._microphone(conn)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await conn.close()
        return self._outcome()

    def _received(self, turn: int) -> np.ndarray:
        """All of a turn's audio received so far (joined once per new piece, not once per frame)."""
        pieces = self.audio[turn]
        if len(pieces) > 1:
            pieces[:] = [np.concatenate(pieces)]
        return pieces[0]

    def _playing(self) -> int | None:
        for turn in sorted(self.audio):
            if turn not in self.cleared and self.pos.get(turn, 0) < len(self._received(turn)):
                return turn
        return None

    async def _microphone(self, conn: Connection) -> None:
        t0, said, ends_at = time.perf_counter(), 0, None
        greeted = asyncio.get_running_loop().time() + 3.0
        marked_held = False
        while ends_at is None or self.frames * 20 < ends_at or self._awaits_answer():
            if self.held != marked_held and self.held_turn is not None:  # tell the server where playback paused
                marked_held = self.held
                await conn.send_json(PlaybackMark(type="playback.mark", turn_id=self.held_turn,
                                                  played_ms=self.pos.get(self.held_turn, 0) / 16.0, paused=self.held))
            turn = None if self.held else self._playing()
            out = np.zeros(FRAME, np.float32)
            if turn is not None:  # the loudspeaker plays the next 20 ms of the reply
                audio = self._received(turn)
                p = self.pos.get(turn, 0)
                out[: len(audio[p : p + FRAME])] = audio[p : p + FRAME]
                self.pos[turn] = p + FRAME
                if (p // FRAME) % MARK_EVERY == 0:
                    await conn.send_json(PlaybackMark(type="playback.mark", turn_id=turn, played_ms=p / 16.0))
            self.spoken.append(out)
            mic = np.zeros(FRAME, np.float32)
            if self.case.echo_ms is not None:  # a speakerphone hears whatever its loudspeaker plays, the greeting too
                back = self.frames - int(self.case.echo_ms // 20)
                if back >= 0:
                    mic += self.spoken[back] * 10 ** (ECHO_DB / 20)
            if self.story is None and self._playing() is None and asyncio.get_running_loop().time() > greeted:
                self.story = -1
                await conn.send_json({"type": "input.text", "text": STORY})
            story_ms = self.pos.get(self.story, 0) / 16.0 if self.story and self.story > 0 else 0.0
            if self.case.audio is not None and said < len(self.case.audio) and (said or story_ms >= self.inject_ms):
                if said == 0:
                    onset_ms, _ = corpus.speech_bounds_ms(self.case.audio, RATE)
                    self.voiced_ms = self.frames * 20 + onset_ms
                chunk = self.case.audio[said : said + FRAME]
                mic[: len(chunk)] += chunk
                said += FRAME
            if ends_at is None and story_ms >= self.inject_ms and (self.case.audio is None or said >= len(self.case.audio)):
                ends_at = self.frames * 20 + 1000 * (AFTER_S if self.case.audio is not None else 6.0)
            await conn.send_audio((np.clip(mic, -1, 1) * 32767).astype("<i2").tobytes())
            self.frames += 1
            ahead = t0 + self.frames * 0.02 - time.perf_counter()
            if ahead > 0:
                await asyncio.sleep(ahead)
            if ends_at is None and self.frames > 3000:
                raise TimeoutError("the reply never played long enough (60 s)")
            if ends_at is not None and self.frames * 20 > ends_at + 30_000:
                return  # a real interruption whose answer never finished: `answered` stays None

    def _awaits_answer(self) -> bool:
        """A real interruption's answer has not finished yet: the loudspeaker goes on playing it, and marking its
        playback, until it has (the server paces a reply by the client's playback, as it does a browser's)."""
        return self.case.family == "real" and self._answered() is None

    async def _read(self, conn: Connection) -> None:
        while True:
            raw = await conn.recv()
            if isinstance(raw, bytes):
                turn, _seq, pcm = unpack_audio(raw)
                samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
                self.audio.setdefault(turn, []).append(soxr.resample(samples, self.rate, RATE).astype(np.float32))
                continue
            msg = json.loads(raw)
            self.msgs.append(msg)
            kind = msg.get("type")
            if kind == "response.text.delta" and self.story == -1:
                self.story = msg["turn_id"]
            elif kind == "vad.speech_started" and msg.get("holds") is not None:
                self.held, self.held_turn = True, msg["holds"]
            elif kind == "response.resumed":
                self.held = False
            elif kind == "response.audio.clear":
                self.cleared.add(msg["turn_id"])
                self.held = False

    def _answered(self) -> str | None:
        finals = {m["turn_id"]: m["text"] for m in self.msgs if m.get("type") == "transcript.final"}
        done = [m["turn_id"] for m in self.msgs  # a reply the user heard out, not one stopped by more of the request
                if m.get("type") == "response.done" and not m.get("interrupted") and m["turn_id"] in finals]
        return finals[done[-1]] if done else None

    def _outcome(self) -> Outcome:
        kinds = lambda t: [m for m in self.msgs if m.get("type") == t]  # noqa: E731
        started = {m["turn_id"] for m in kinds("vad.speech_started")}
        dropped = {m["turn_id"] for m in kinds("vad.speech_ended") if m.get("dropped")}
        clear = next((m for m in kinds("response.audio.clear") if m["turn_id"] == self.story), None)
        resumed = next((m for m in kinds("response.resumed") if m["turn_id"] == self.story), None)
        since = lambda m: None if m is None or self.voiced_ms is None else round(m["t_ms"] - self.voiced_ms, 1)  # noqa: E731
        finals = [m["text"] for m in kinds("transcript.final") if m["turn_id"] in started - dropped]
        heard = resumed["heard"] if resumed is not None else finals[0] if finals else None
        return Outcome(self.case.family, self.case.name, clear is not None, len(started - dropped), since(clear),
                       since(resumed), self._answered() if self.case.family == "real" else None, heard,
                       speech_events=len(started))  # fmt: skip


async def run_all(server: str, selected: list[Case], seed: int) -> list[Outcome]:
    rng = random.Random(seed)
    out = []
    for case in selected:
        try:
            out.append(await Speakerphone(server, case, rng.uniform(600.0, 1000.0)).run())
        except (OSError, TimeoutError, RuntimeError) as exc:
            out.append(Outcome(case.family, case.name, False, 0, None, None, error=repr(exc)))
        print(f"  {out[-1].family:12s} {out[-1].name:45s} stopped={out[-1].stopped!s:5s} turns={out[-1].turns_opened} "
              f"decided={out[-1].decision_ms} resumed={out[-1].resume_ms} heard={out[-1].heard!r} "
              f"speech={out[-1].speech_events}", flush=True)  # fmt: skip
    return out


def table(outcomes: list[Outcome]) -> str:
    med = lambda xs: f"{statistics.median(xs):.0f}" if xs else "-"  # noqa: E731
    rows = ["| family | cases | replies stopped | turns opened | decision ms (median, max) | resume ms (median, max) |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for family in ("backchannel", "noise", "echo", "real"):
        got = [o for o in outcomes if o.family == family]
        if not got:
            continue
        dec = [o.decision_ms for o in got if o.decision_ms is not None]
        res = [o.resume_ms for o in got if o.resume_ms is not None]
        rows.append(f"| {family} | {len(got)} | {sum(o.stopped for o in got)} | {sum(o.turns_opened for o in got)} | "
                    f"{med(dec)}, {max(dec, default=0):.0f} | {med(res)}, {max(res, default=0):.0f} |")  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", help="a running server's URL (default: start `parley serve` on the embedded models)")
    ap.add_argument("--tiny", action="store_true", help="one case per family (the test suite's run)")
    ap.add_argument("--family", nargs="+", choices=("backchannel", "noise", "echo", "real"), help="only these families")
    ap.add_argument("--repeat", type=int, default=1, help="run each case this many times")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the outcomes as JSON")
    args = ap.parse_args(argv)
    selected = [c for c in cases(args.tiny) if args.family is None or c.family in args.family] * max(1, args.repeat)
    server = None
    if args.server is None:
        tmp = Path(tempfile.mkdtemp(prefix="parley-interruptions-"))
        server = start_server(tmp / "traces.jsonl", tmp / "server.log")
    try:
        outcomes = asyncio.run(run_all(args.server or server.url, selected, args.seed))  # type: ignore[union-attr]
    finally:
        if server is not None:
            server.stop()
    print(table(outcomes))
    if args.out:
        args.out.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))


if __name__ == "__main__":
    main()
