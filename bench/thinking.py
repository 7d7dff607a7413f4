"""Thinking aloud through the real recogniser: phrases a user says while thinking ("Um... let me think.", "One
second.") and requests beside them, spoken by Piper, flite and espeak-ng, transcribed by the embedded Whisper, and
read by the rule that gives a thinking turn silence (voice.interjection.only_thinking, config `vad.thinking`).

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.thinking [--tiny] [--voices piper,flite,espeak]
"""
from __future__ import annotations

import argparse

import numpy as np

from bench import corpus
from voice.interjection import Lexicon, only_thinking

THINKING = ["Um... let me think.", "Hmm.", "Uh, one second.", "Let me see.", "Hold on.", "Give me a moment."]
REQUESTS = ["Um, what time is it?", "Are you there?", "So what is the weather like?", "Well, tell me a joke."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--voices", default="piper,flite,espeak")
    ap.add_argument("--tiny", action="store_true", help="one voice, two phrases of each kind (the tests' form)")
    args = ap.parse_args()
    from parley.locate import resolve
    from voice.asr import WhisperTranscriber

    voices = ["piper"] if args.tiny else args.voices.split(",")
    thinking, requests = (THINKING[-2:], REQUESTS[:2]) if args.tiny else (THINKING, REQUESTS)
    cases = [(t, True) for t in thinking] + [(t, False) for t in requests]
    asr = WhisperTranscriber(str(resolve("asr", "embedded")), cpu_threads=1)
    lexicon = Lexicon.of()
    print("| said | voice | heard | thinking (silence) | right |")
    print("|---|---|---|---|---|")
    right = {True: 0, False: 0}
    for text, is_thinking in cases:
        for voice in voices:
            audio = np.concatenate([corpus.silence(300), corpus.speak(text, voice), corpus.silence(300)])
            heard = asr.transcribe(audio).text
            said = only_thinking(heard, lexicon)
            right[is_thinking] += said == is_thinking
            print(f"| {text} | {voice} | {heard} | {'yes' if said else 'no'} | {'yes' if said == is_thinking else 'NO'} |")
    n_think = sum(1 for _, t in cases if t) * len(voices)
    n_req = sum(1 for _, t in cases if not t) * len(voices)
    print(f"\nthinking read as thinking: {right[True]} of {n_think}; requests read as requests: {right[False]} of {n_req}")


if __name__ == "__main__":
    main()
