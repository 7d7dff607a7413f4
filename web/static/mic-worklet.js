// AudioWorklet: microphone samples -> 20 ms PCM16 frames at 16 kHz, each with its loudness.
// Runs on the audio thread; knows nothing of sockets (the page sends what it posts).

const TARGET_RATE = 16000;
const FRAME_SAMPLES = 320; // 20 ms at 16 kHz

class MicProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    this.voicedRms = opts.voicedRms ?? 0.01; // about -40 dBFS: quiet speech, above room noise after NS
    this.step = sampleRate / TARGET_RATE; // input samples per output sample (1.0 when the context runs at 16 kHz)
    this.pos = 0; // fractional read position for the linear resampler
    this.prev = 0;
    this.frame = new Int16Array(FRAME_SAMPLES);
    this.filled = 0;
    this.sumSq = 0;
    this.peak = 0;
    this.frames = 0;
    this.port.onmessage = (ev) => {
      if (ev.data?.type === "config" && typeof ev.data.voicedRms === "number") this.voicedRms = ev.data.voicedRms;
    };
  }

  push(x) {
    const s = Math.max(-1, Math.min(1, x));
    this.frame[this.filled++] = s < 0 ? s * 0x8000 : s * 0x7fff;
    this.sumSq += s * s;
    const a = Math.abs(s);
    if (a > this.peak) this.peak = a;
    if (this.filled === FRAME_SAMPLES) {
      const rms = Math.sqrt(this.sumSq / FRAME_SAMPLES);
      const pcm = this.frame.buffer;
      this.port.postMessage(
        { type: "frame", pcm, rms, peak: this.peak, voiced: rms >= this.voicedRms, index: this.frames++, time: currentTime },
        [pcm],
      );
      this.frame = new Int16Array(FRAME_SAMPLES);
      this.filled = 0;
      this.sumSq = 0;
      this.peak = 0;
    }
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true;
    const input = channels[0]; // [128] mono (the mic stream is downmixed by channelCount: 1)
    if (this.step === 1) {
      for (let i = 0; i < input.length; i++) this.push(input[i]);
      return true;
    }
    // Linear interpolation between the previous block's last sample and this block: good enough for speech.
    let pos = this.pos;
    while (pos < input.length) {
      const i = Math.floor(pos);
      const frac = pos - i;
      const a = i === 0 ? this.prev : input[i - 1];
      const b = input[i];
      this.push(a + (b - a) * frac);
      pos += this.step;
    }
    this.pos = pos - input.length;
    this.prev = input[input.length - 1];
    return true;
  }
}

registerProcessor("parley-mic", MicProcessor);
