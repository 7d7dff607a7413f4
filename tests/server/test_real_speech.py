"""A real person's recorded speech (bench.real_speech: the Asterisk prompts, 8 kHz as recorded) over /ws at the
wire's own rate: the server's front end resamples it and the transcript matches what she said."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from bench import corpus, real_speech
from support.waiting import wait_for
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PROMPTS = ("privacy-prompt", "conf-getpin")
# bench.noise's clean rows: 3-7 % WER over 30 prompts (docs/benchmarks.md, Noisy rooms); two prompts vary more
MAX_WER = 0.15


async def test_a_real_voice_at_8_khz_is_recognised_through_ws(live_server) -> None:
    if not real_speech.available():
        pytest.fail(f"the real-speech corpus is missing: apt-get install {real_speech.PACKAGES}")
    texts = real_speech.transcripts()
    refs, hyps = [], []
    async with Client(live_server.ws_url()) as c:
        await c.start(sample_rate=8000, echo_cancelled=True)
        await c.wait_for("response.done")  # the greeting; she speaks after it
        for name in PROMPTS:
            audio, rate = sf.read(str(real_speech.SOUNDS / f"{name}.wav"), dtype="float32")
            assert rate == 8000
            quiet = np.zeros(rate * 13 // 10, np.float32)
            finals = len(c.of("transcript.final"))
            await c.stream(np.concatenate([quiet[: rate // 5], audio, quiet]), rate=rate)
            await c.wait_for("transcript.final", n=finals + 1, timeout_s=60)
            # answered: the reply to the last final ended (a pause mid-prompt may have ended a turn early, and the rest
            # of it then joined that turn as a new final: the last one is what she said)
            await wait_for(lambda: any(d["turn_id"] == c.of("transcript.final")[-1]["turn_id"] for d in c.of("response.done")),
                           timeout_s=120, what="the reply to her prompt")  # fmt: skip
            refs.append(texts[name])
            hyps.append(c.of("transcript.final")[-1]["text"])
    assert corpus.wer(refs, hyps) <= MAX_WER, list(zip(refs, hyps))
