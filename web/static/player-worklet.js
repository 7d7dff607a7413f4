// AudioWorklet: a ring buffer of reply audio at the context's rate (the server's output_sample_rate).
// Plays what the page pushes, empties at once on "clear", and reports what it actually played.
// Knows turn ids only as labels on the samples; nothing of the protocol or the socket.

const CAPACITY = 1 << 22; // samples: ~190 s at 22.05 kHz, more than any reply; overflow drops the newest
const REPORT_EVERY = 8; // render quanta between progress reports (8 x 128 samples, ~46 ms at 22.05 kHz)
const AUDIBLE = 1e-4; // |sample| above this counts as non-silent output

class PlayerProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Float32Array(CAPACITY);
    this.read = 0; // absolute sample counters; index = counter % CAPACITY
    this.write = 0;
    this.segments = []; // [{turnId, end}] in write order: which turn the samples up to `end` belong to
    this.turnId = null; // turn now playing (kept through an underrun: the next phrase may still come)
    this.playing = false; // samples were output in the last quantum
    this.turnPlayed = 0; // samples of `turnId` played so far
    this.totalPlayed = 0;
    this.audible = 0; // non-silent samples played, all turns
    this.sumSq = 0; // over the current report window
    this.windowSamples = 0;
    this.peak = 0;
    this.quanta = 0;
    this.dropped = 0;
    this.port.onmessage = (ev) => this.onMessage(ev.data);
  }

  onMessage(msg) {
    if (msg.type === "push") {
      const pcm = new Int16Array(msg.pcm);
      const room = CAPACITY - (this.write - this.read);
      const n = Math.min(room, pcm.length);
      for (let i = 0; i < n; i++) this.ring[(this.write + i) % CAPACITY] = pcm[i] / 32768;
      this.write += n;
      this.dropped += pcm.length - n;
      const last = this.segments[this.segments.length - 1];
      if (last && last.turnId === msg.turnId) last.end = this.write;
      else this.segments.push({ turnId: msg.turnId, end: this.write });
    } else if (msg.type === "clear") {
      // Drop everything buffered (the server's clear names one turn, but older turns' leftovers
      // are stale too once a barge-in happens).
      const dropped = this.write - this.read;
      const turnId = this.turnId;
      const played = this.turnPlayed;
      this.read = this.write;
      this.segments = [];
      this.playing = false;
      this.port.postMessage({ type: "cleared", turnId, playedSamples: played, droppedSamples: dropped, frame: currentFrame, reason: msg.reason });
    }
  }

  process(_inputs, outputs) {
    const out = outputs[0];
    const left = out[0]; // [128]
    let i = 0;
    while (i < left.length && this.read < this.write) {
      const seg = this.segments[0];
      if (this.turnId !== seg.turnId) {
        if (this.turnId !== null) this.port.postMessage({ type: "ended", turnId: this.turnId, playedSamples: this.turnPlayed });
        this.turnId = seg.turnId;
        this.turnPlayed = 0;
        this.port.postMessage({ type: "started", turnId: seg.turnId, frame: currentFrame + i });
      }
      this.playing = true;
      const s = this.ring[this.read % CAPACITY];
      left[i++] = s;
      this.read += 1;
      this.turnPlayed += 1;
      this.totalPlayed += 1;
      const a = Math.abs(s);
      if (a > AUDIBLE) this.audible += 1;
      if (a > this.peak) this.peak = a;
      this.sumSq += s * s;
      if (this.read >= seg.end) this.segments.shift();
    }
    for (; i < left.length; i++) left[i] = 0;
    for (let c = 1; c < out.length; c++) out[c].set(left);
    this.windowSamples += left.length;
    if (this.playing && this.read === this.write) {
      this.playing = false;
      this.port.postMessage({ type: "drained", turnId: this.turnId, playedSamples: this.turnPlayed, frame: currentFrame });
    }
    if (++this.quanta % REPORT_EVERY === 0) {
      this.port.postMessage({
        type: "progress",
        turnId: this.turnId,
        playing: this.playing,
        turnPlayed: this.turnPlayed,
        totalPlayed: this.totalPlayed,
        audible: this.audible,
        buffered: this.write - this.read,
        rms: Math.sqrt(this.sumSq / this.windowSamples),
        peak: this.peak,
        dropped: this.dropped,
        frame: currentFrame,
      });
      this.sumSq = 0;
      this.windowSamples = 0;
      this.peak = 0;
    }
    return true;
  }
}

registerProcessor("parley-player", PlayerProcessor);
