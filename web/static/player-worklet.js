// AudioWorklet: a ring buffer of reply audio at the context's rate (the server's output_sample_rate).
// Plays what the page pushes, empties at once on "clear", and reports what it actually played.
// Knows turn ids only as labels on the samples; nothing of the protocol or the socket.
// Jitter target (docs/protocol.md, Client playback start): 0 at first, so a reply plays from the render quantum after
// its first message; a turn that runs dry part-way and goes on (an underrun) raises it by STEP_MS (up to MAX_TARGET_MS),
// a turn played through without one lowers it again. A start or a resume waits for the target to be queued, or for
// the target's own length of time at most (a reply's short tail is not held back for audio that never comes).

const CAPACITY = 1 << 22; // samples: ~190 s at 22.05 kHz, more than any reply; overflow drops the newest
const REPORT_EVERY = 8; // render quanta between progress reports (8 x 128 samples, ~46 ms at 22.05 kHz)
const AUDIBLE = 1e-4; // |sample| above this counts as non-silent output
const HF_CUTOFF_HZ = 5500; // energy above this tells a wideband voice (Piper) from a narrowband one (flite 8 kHz)
const STEP_MS = 20; // the jitter target grows by this after an underrun and shrinks by it after a smooth turn
const MAX_TARGET_MS = 200;

// RBJ high-pass biquad coefficients, normalised by a0.
function highPass(rate, f0, q = Math.SQRT1_2) {
  const w = (2 * Math.PI * f0) / rate;
  const alpha = Math.sin(w) / (2 * q);
  const c = Math.cos(w);
  const a0 = 1 + alpha;
  return { b0: (1 + c) / 2 / a0, b1: -(1 + c) / a0, b2: (1 + c) / 2 / a0, a1: (-2 * c) / a0, a2: (1 - alpha) / a0 };
}

// Two cascaded biquads (4th order): the share of a turn's energy above the cutoff.
class HfMeter {
  constructor(rate) {
    this.k = highPass(rate, Math.min(HF_CUTOFF_HZ, rate * 0.45));
    this.z = new Float64Array(8); // x1, x2, y1, y2 for each stage
    this.reset();
  }

  reset() {
    this.z.fill(0);
    this.total = 0;
    this.high = 0;
  }

  add(x) {
    const { b0, b1, b2, a1, a2 } = this.k;
    const z = this.z;
    let v = x;
    for (let s = 0; s < 8; s += 4) {
      const y = b0 * v + b1 * z[s] + b2 * z[s + 1] - a1 * z[s + 2] - a2 * z[s + 3];
      z[s + 1] = z[s];
      z[s] = v;
      z[s + 3] = z[s + 2];
      z[s + 2] = y;
      v = y;
    }
    this.total += x * x;
    this.high += v * v;
  }

  get ratio() {
    return this.total > 0 ? this.high / this.total : 0;
  }
}

class PlayerProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Float32Array(CAPACITY);
    this.read = 0; // absolute sample counters; index = counter % CAPACITY
    this.write = 0;
    this.segments = []; // [{turnId, end}] in write order: which turn the samples up to `end` belong to
    this.turnId = null; // turn now playing (kept through an underrun: the next phrase may still come)
    this.playing = false; // samples were output in the last quantum
    this.held = false; // paused in place: the user may be interrupting (released if it was a cough)
    this.turnPlayed = 0; // samples of `turnId` played so far
    this.totalPlayed = 0;
    this.audible = 0; // non-silent samples played, all turns
    this.sumSq = 0; // over the current report window
    this.windowSamples = 0;
    this.peak = 0;
    this.quanta = 0;
    this.dropped = 0;
    this.target = 0; // jitter target in samples (adaptive, see the top)
    this.waitFrames = 0; // render frames spent waiting for the target since the last start/resume attempt
    this.dryTurn = null; // the turn whose audio ran out while it played: more of it means an underrun
    this.turnUnderruns = 0; // underruns of the turn now playing
    this.underruns = 0; // all turns
    this.hf = new HfMeter(sampleRate);
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
    } else if (msg.type === "hold" || msg.type === "release") {
      this.held = msg.type === "hold";
      if (this.held) this.playing = false;
      this.port.postMessage({ type: this.held ? "held" : "released", turnId: this.turnId, frame: currentFrame });
    } else if (msg.type === "clear") {
      this.held = false;
      // Drop everything buffered (the server's clear names one turn, but older turns' leftovers
      // are stale too once a barge-in happens).
      const dropped = this.write - this.read;
      const turnId = this.turnId;
      const played = this.turnPlayed;
      this.read = this.write;
      this.segments = [];
      this.playing = false;
      this.dryTurn = null; // a barge-in is no underrun
      this.waitFrames = 0;
      this.turnId = null; // the next audio starts a turn afresh, even one with the same id (new session)
      this.turnPlayed = 0;
      this.port.postMessage({ type: "cleared", turnId, playedSamples: played, droppedSamples: dropped, hfRatio: this.hf.ratio, consumed: this.read + this.dropped, frame: currentFrame, reason: msg.reason });
    }
  }

  // Before a start or a resume: true while less than the jitter target is queued and it has not waited that long.
  waiting(frames) {
    if (this.playing || this.target === 0 || this.write - this.read >= this.target || this.waitFrames >= this.target) {
      this.waitFrames = 0;
      return false;
    }
    this.waitFrames += frames;
    return true;
  }

  // A turn's last sample has played (another turn follows, or nothing did): a smooth one lowers the target.
  endTurn() {
    if (this.turnId !== null && this.turnPlayed > 0 && this.turnUnderruns === 0) {
      this.target = Math.max(0, this.target - Math.round((STEP_MS * sampleRate) / 1000));
    }
  }

  process(_inputs, outputs) {
    const out = outputs[0];
    const left = out[0]; // [128]
    let i = 0;
    if (this.dryTurn !== null && !this.held && this.read < this.write) {
      if (this.dryTurn === this.segments[0].turnId && this.turnId === this.dryTurn) {
        // the turn ran dry part-way and goes on: an underrun; this resume and later starts wait for a larger target
        this.turnUnderruns += 1;
        this.underruns += 1;
        this.target = Math.min(Math.round((MAX_TARGET_MS * sampleRate) / 1000), this.target + Math.round((STEP_MS * sampleRate) / 1000));
        this.port.postMessage({ type: "underrun", turnId: this.turnId, underruns: this.turnUnderruns, targetMs: (this.target * 1000) / sampleRate, frame: currentFrame });
      }
      this.dryTurn = null;
    }
    const ready = !this.held && this.read < this.write && !this.waiting(left.length);
    while (ready && i < left.length && this.read < this.write) {
      const seg = this.segments[0];
      if (this.turnId !== seg.turnId) {
        if (this.turnId !== null) {
          this.endTurn();
          this.port.postMessage({ type: "ended", turnId: this.turnId, playedSamples: this.turnPlayed, hfRatio: this.hf.ratio, underruns: this.turnUnderruns });
        }
        this.turnId = seg.turnId;
        this.turnPlayed = 0;
        this.turnUnderruns = 0;
        this.hf.reset();
        this.port.postMessage({ type: "started", turnId: seg.turnId, frame: currentFrame + i, targetMs: (this.target * 1000) / sampleRate });
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
      this.hf.add(s);
      if (this.read >= seg.end) this.segments.shift();
    }
    for (; i < left.length; i++) left[i] = 0;
    for (let c = 1; c < out.length; c++) out[c].set(left);
    this.windowSamples += left.length;
    if (this.playing && this.read === this.write) {
      this.playing = false;
      this.dryTurn = this.turnId; // more of it later is an underrun; none (another turn, or nothing) is its end
      this.port.postMessage({ type: "drained", turnId: this.turnId, playedSamples: this.turnPlayed, hfRatio: this.hf.ratio, consumed: this.read + this.dropped, frame: currentFrame });
    }
    if (++this.quanta % REPORT_EVERY === 0) {
      this.port.postMessage({
        type: "progress",
        turnId: this.turnId,
        playing: this.playing,
        held: this.held,
        turnPlayed: this.turnPlayed,
        hfRatio: this.hf.ratio,
        totalPlayed: this.totalPlayed,
        audible: this.audible,
        buffered: this.write - this.read,
        rms: Math.sqrt(this.sumSq / this.windowSamples),
        peak: this.peak,
        dropped: this.dropped,
        underruns: this.underruns,
        targetMs: (this.target * 1000) / sampleRate,
        consumed: this.read + this.dropped, // every sample pushed ends up read, cleared or dropped
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
