"""What a user said over a reply means: nothing (noise, music, a cough), a backchannel ("uh-huh", "got it"), the
assistant's own voice coming back, or a real interruption ("wait", "no, tell me about Mars").

Pure: words in (a recogniser's text of the interjection, with its confidence, and the reply's recent words), a
verdict out. It knows no audio, no time and no models; voice.turntaking decides what a verdict does to the reply.
The rule and its measurements: docs/turn-taking.md, "Interruptions".
"""
from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class Kind(enum.Enum):
    NONE = "none"  # no words: noise, music, a cough, a knock, silence the VAD took for speech
    BACKCHANNEL = "backchannel"  # "uh-huh", "yeah", "I see": the listener is listening, the reply goes on
    ECHO = "echo"  # the reply's own words, heard back through the user's microphone
    STOP = "stop"  # a word from the stop lexicon ("wait", "stop", "no"): an interruption at once
    INTERRUPT = "interrupt"  # words that are none of the above: the user takes the floor
    UNSURE = "unsure"  # words too few or too unsure to say yet: wait for more audio


# Backchannels and acknowledgements, as a recogniser writes them (Whisper spells "mm-hmm" a dozen ways).
BACKCHANNELS: tuple[str, ...] = (
    "uh huh", "uh-huh", "uhhuh", "uh-uh", "mm hmm", "mm-hmm", "mmhmm", "mhm", "mm", "hmm", "hm", "mmm", "uh", "um", "ah", "oh",
    "yeah", "yea", "yes", "yep", "yup", "ya", "okay", "ok", "right", "alright", "all right", "sure", "got it",
    "i see", "i know", "cool", "nice", "great", "wow", "really", "true", "exactly", "indeed", "of course", "fine",
    "good", "perfect", "totally", "absolutely", "definitely", "interesting", "makes sense", "gotcha", "aha", "ahh",
    "ooh", "oh okay", "oh yeah", "oh really", "oh wow", "uh oh", "yeah yeah", "thanks", "thank you", "sounds good",
    "that's right", "that makes sense", "go on", "i understand", "understood", "huh", "neat", "awesome", "lovely",
)  # fmt: skip

# One or two words that stop a reply on their own, wherever they come in the interjection. Not "sorry": Whisper
# writes "I'm sorry." for a murmured "got it" (and a real "sorry, ..." goes on with words that interrupt).
STOP_WORDS: tuple[str, ...] = (
    "wait", "stop", "no", "nope", "hold on", "hang on", "hold it", "hold up", "actually", "excuse me",
    "pause", "enough", "cancel", "never mind", "shut up", "quiet", "be quiet", "but", "hey", "listen", "what", "why",
)  # fmt: skip

# A turn of nothing but these (and words too common to mean anything: only_thinking) is the user thinking aloud
# ("Um... let me think."): silence, not a reply. The fillers as Whisper spells them, then the phrases.
THINKING: tuple[str, ...] = (
    "um", "umm", "uh", "uhh", "uhm", "er", "erm", "em", "ehm", "eh", "hmm", "hmmm", "hm", "mm", "mmm", "ah", "so", "well",
    "let me think", "let me see", "let's see", "one second", "one sec", "one moment", "just a second", "just a sec",
    "just a moment", "a second", "give me a second", "give me a sec", "give me a moment", "wait a second",
    "wait a moment", "hang on", "hold on",
)  # fmt: skip

# What Whisper writes for sound that is not speech (and the subtitles it learnt from): never words.
NON_WORDS: frozenset[str] = frozenset({"you", "bye", "bye bye", "so", "the", "a", "and", "thank you for watching",
                                        "thanks for watching", "music", "applause", "laughter", "silence", "cough",
                                        "coughing", "sigh", "noise", "beep", "inaudible", "blank audio"})  # fmt: skip


# Words too common to say anything on their own about what was meant.
FUNCTION_WORDS: frozenset[str] = frozenset({
    "the", "a", "an", "and", "or", "of", "to", "in", "on", "at", "for", "with", "from", "by", "is", "are", "was", "be",
    "it", "its", "it's", "this", "that", "these", "those", "i", "i'm", "you", "me", "we", "he", "she", "they", "my",
    "your", "our", "do", "can", "so", "as", "if", "then", "there", "here", "up", "out", "just", "not",
})  # fmt: skip


@dataclass(frozen=True)
class Lexicon:
    """The words that decide, per language or persona (config `interruptions`)."""

    backchannels: frozenset[str] = frozenset(BACKCHANNELS)
    stop_words: frozenset[str] = frozenset(STOP_WORDS)
    non_words: frozenset[str] = NON_WORDS
    thinking: frozenset[str] = frozenset(THINKING)

    @classmethod
    def of(cls, backchannels: Iterable[str] | None = None, stop_words: Iterable[str] | None = None,
           thinking: Iterable[str] | None = None) -> "Lexicon":  # fmt: skip
        """The default lexicon with any list replaced (each entry normalised as the recogniser's text is)."""
        norm = lambda items: frozenset(" ".join(words(item)) for item in items)  # noqa: E731
        return cls(
            backchannels=norm(BACKCHANNELS if backchannels is None else backchannels),
            stop_words=norm(STOP_WORDS if stop_words is None else stop_words),
            thinking=norm(THINKING if thinking is None else thinking),
        )


@dataclass(frozen=True)
class Heard:
    """One recognition of an interjection's audio so far."""

    text: str
    avg_logprob: float  # the recogniser's confidence (0 when nothing was heard)
    audio_ms: float  # how much of the interjection the text covers


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    words: tuple[str, ...]  # the interjection's words, normalised
    why: str  # for the trace: the words or rule that decided

    @property
    def interrupts(self) -> bool:
        return self.kind in (Kind.STOP, Kind.INTERRUPT)


_BRACKETED = re.compile(r"[\[(*♪][^\])*♪]*[\])*♪]?")  # "[MUSIC]", "(coughs)", "*sigh*", "♪ la la ♪"
_WORD = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")

LAST_WORDS = 8  # about the last two seconds of a reply: what may be playing (and echoing) now
ECHO_MIN_SHARE = 0.6  # this share of an interjection's words among the reply's recent words: the reply's own voice
MIN_LOGPROB = -1.0  # below this the recogniser is guessing: such words neither interrupt nor count as content
# Words that are neither stop words nor backchannels interrupt only when the recogniser is fairly sure of them: on a
# murmured "mm-hmm" Whisper tiny.en writes "We have them." at -0.97 (a real request over the reply: -0.3 to -0.75).
CONTENT_MIN_LOGPROB = -0.9
EARLY_CONTENT_WORDS = 2  # while the user still speaks, this many content words interrupt without waiting for a pause
# One word that is neither a stop word nor a backchannel interrupts only when the recogniser is sure of it: on a
# short murmur Whisper writes a plausible word ("went" for Piper's "uh-huh", at about -0.8).
ONE_WORD_MIN_LOGPROB = -0.5


def words(text: str) -> list[str]:
    """Lower-case words without punctuation, bracketed sound labels dropped, back-to-back repeats collapsed
    (Whisper's "Right. Right." for one "right")."""
    plain = _BRACKETED.sub(" ", text.lower()).replace("’", "'")
    out: list[str] = []
    for w in _WORD.findall(plain):
        if not out or out[-1] != w:
            out.append(w)
    return out


def _spans(ws: Sequence[str], phrases: frozenset[str]) -> list[tuple[int, int]]:
    """(start, end) of each phrase of `phrases` found in `ws`, longest first at each position."""
    longest = max((len(p.split()) for p in phrases), default=0)
    found, i = [], 0
    while i < len(ws):
        for n in range(min(longest, len(ws) - i), 0, -1):
            if " ".join(ws[i : i + n]) in phrases:
                found.append((i, i + n))
                i += n
                break
        else:
            i += 1
    return found


def _covered(ws: Sequence[str], phrases: frozenset[str]) -> bool:
    return sum(b - a for a, b in _spans(ws, phrases)) == len(ws)


def only_stop_words(text: str, lexicon: Lexicon) -> bool:
    """`text` says nothing but stop words ("No.", "Wait, hold on."): after a barge-in, most often the start of what
    the user wants ("No, tell me about Mars instead"), not all of it."""
    ws = words(text)
    return bool(ws) and _covered(ws, lexicon.stop_words)


def only_thinking(text: str, lexicon: Lexicon) -> bool:
    """`text` is nothing but the user thinking aloud ("Um.", "Hmm, let me think.", "One second."): a turn that wants
    silence, not a reply; the request comes next. Words too common to mean anything alone may come before the
    thinking: the recogniser writes a filler it cannot spell as one ("And let me think.", "At one second."); after
    it they are a question ("Well, is it?")."""
    ws = words(text)
    spans = _spans(ws, lexicon.thinking)
    if not spans:
        return False
    inside = {i for a, b in spans for i in range(a, b)}
    return all(i in inside or (i < spans[0][0] and w in FUNCTION_WORDS) for i, w in enumerate(ws))


def echo_share(ws: Sequence[str], recent: Sequence[str]) -> float:
    """The share of `ws` that the reply's recent words hold in the same order (a longest common subsequence):
    echo comes back as the reply's words in the reply's order, mangled here and there by the recogniser."""
    if not ws or not recent:
        return 0.0
    prev = [0] * (len(recent) + 1)
    for w in ws:
        cur = [0]
        for j, r in enumerate(recent):
            cur.append(prev[j] + 1 if w == r else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1] / len(ws)


def classify(heard: Heard, recent_reply_words: Sequence[str], lexicon: Lexicon, *, final: bool) -> Verdict:
    """The verdict on an interjection from its words. `final`: the user has paused, this is all of it; before that
    a verdict that could still change (a backchannel that may go on "... but why?") comes back UNSURE."""
    ws = words(heard.text)
    if heard.avg_logprob < MIN_LOGPROB:
        ws = []  # a guess is no evidence of words
    said = tuple(ws)
    if not ws or _covered(ws, lexicon.non_words):
        return Verdict(Kind.NONE, said, "no words")
    stops = _spans(ws, lexicon.stop_words)
    echo = echo_share(ws, recent_reply_words)
    # The reply's own words win over a stop word with two words or more in the reply's order, or as a lone word among
    # the last few the reply said ("what?" of "... what shall we talk about?"): a lone "no" it said a while ago is
    # more likely the user's than the echo's.
    if echo >= ECHO_MIN_SHARE and (len(ws) >= 2 or not stops or ws[0] in recent_reply_words[-LAST_WORDS:]):
        return Verdict(Kind.ECHO, said, f"{echo:.0%} of the words are the reply's")
    if stops:
        a, b = stops[0]
        return Verdict(Kind.STOP, said, " ".join(ws[a:b]))
    if _covered(ws, lexicon.backchannels):
        return Verdict(Kind.BACKCHANNEL if final else Kind.UNSURE, said, "backchannel")
    # content: not backchannels, not function words, not single letters ("N f"): what a garbled echo ("the last."
    # for "... talk about?") or a murmur is made of does not count
    content = [w for w in ws if w not in lexicon.backchannels and w not in FUNCTION_WORDS and len(w) > 1]
    if heard.avg_logprob < CONTENT_MIN_LOGPROB:
        content = []
    if len(content) >= EARLY_CONTENT_WORDS or (final and content and heard.avg_logprob >= ONE_WORD_MIN_LOGPROB):
        return Verdict(Kind.INTERRUPT, said, " ".join(content))
    if final:
        return Verdict(Kind.NONE, said, f"words too unsure to interrupt ({heard.avg_logprob:.2f})")
    return Verdict(Kind.UNSURE, said, "one word so far")
