// Reply playback: an AudioContext at the server's output rate feeding the ring-buffer worklet.
// Holds audio back while the browser keeps sound off (no user gesture yet) and plays it once allowed.
// Turns worklet reports into page-clock events; knows nothing of the socket.
// Measures its own playback start per turn: from the turn's first audio message arriving (the page clock at the
// socket's onmessage) to its first sample leaving the output (the worklet's frame, on the context's output clock).

const MAX_PENDING_SAMPLES = 60 * 48000; // held-back audio beyond a minute is dropped, oldest first
// The smallest output buffer the device allows: a number asks for it, where "interactive" lets the browser pick its
// usual low one (Chromium: 40 ms reported vs 23 ms for 0, docs/benchmarks.md, Client playback start).
const LATENCY_HINT_S = 0;

export class Player extends EventTarget {
  constructor() {
    super();
    this.context = null;
    this.node = null;
    this.sampleRate = null;
    this.opening = null; // the in-flight prepare(), so concurrent callers share one context
    this.pending = []; // [{turnId, pcm}] waiting for a running context
    this.pendingSamples = 0;
    this.pushed = 0; // samples handed to the worklet, for idle detection
    this.arrivals = new Map(); // turnId -> page time its first audio message arrived, until its first sample plays
    this.state = { turnId: null, playing: false, held: false, buffered: 0, totalPlayed: 0, audible: 0, peak: 0, rms: 0, turnPlayed: 0, consumed: 0 };
  }

  // Creates the context and worklet; without a user gesture the browser may leave it suspended.
  prepare(sampleRate) {
    if (this.sampleRate === sampleRate && this.opening) return this.opening;
    const old = this.context;
    this.sampleRate = sampleRate;
    this.context = null;
    this.node = null;
    this.pushed = 0;
    this.state.consumed = 0;
    this.opening = (async () => {
      if (old) await old.close();
      const context = new AudioContext({ sampleRate, latencyHint: LATENCY_HINT_S });
      this.context = context;
      context.addEventListener("statechange", () => this.flush());
      await context.audioWorklet.addModule(new URL("./player-worklet.js", import.meta.url));
      const node = new AudioWorkletNode(context, "parley-player", { numberOfInputs: 0, outputChannelCount: [1] });
      node.port.onmessage = (ev) => this.onReport(ev.data);
      node.connect(context.destination);
      this.node = node;
      this.flush();
    })();
    return this.opening;
  }

  // Call inside a user gesture (click, key): lets held-back audio play.
  async ensure(sampleRate) {
    await this.prepare(sampleRate);
    if (this.context.state !== "running") await this.context.resume();
    this.flush();
  }

  get ready() {
    return this.node !== null;
  }

  get running() {
    return this.node !== null && this.context?.state === "running";
  }

  // Nothing queued here or in the worklet.
  get idle() {
    return this.pending.length === 0 && this.state.consumed >= this.pushed;
  }

  // `arrivedAt`: performance.now() when the message arrived (the start of the client's own playback start).
  push(turnId, pcm, arrivedAt = performance.now()) {
    if (!this.arrivals.has(turnId)) this.arrivals.set(turnId, arrivedAt);
    this.pending.push({ turnId, pcm: pcm.slice() }); // our own copy: it is transferred to the worklet
    this.pendingSamples += pcm.length;
    while (this.pendingSamples > MAX_PENDING_SAMPLES && this.pending.length > 1) {
      this.pendingSamples -= this.pending.shift().pcm.length;
    }
    this.flush();
  }

  flush() {
    if (!this.running) return;
    for (const { turnId, pcm } of this.pending) {
      this.pushed += pcm.length;
      this.node.port.postMessage({ type: "push", turnId, pcm: pcm.buffer }, [pcm.buffer]);
    }
    this.pending = [];
    this.pendingSamples = 0;
  }

  // Pause in place (the reply may resume) / resume; clear() ends the hold too.
  hold() {
    if (!this.node || this.state.held) return;
    this.state.held = true;
    this.node.port.postMessage({ type: "hold" });
  }

  release() {
    if (!this.node || !this.state.held) return;
    this.state.held = false;
    this.node.port.postMessage({ type: "release" });
  }

  clear(reason) {
    this.arrivals.clear(); // whatever was waiting to start is dropped with it
    this.pending = [];
    this.pendingSamples = 0;
    if (!this.node) return;
    this.state.held = false;
    this.node.port.postMessage({ type: "clear", reason });
  }

  onReport(msg) {
    const at = performance.now();
    if (msg.type === "progress") {
      const held = this.state.held; // ours is newer than the worklet's report
      Object.assign(this.state, msg);
      this.state.held = held;
    } else if (msg.type === "started") {
      this.state.playing = true;
      this.state.turnId = msg.turnId;
      Object.assign(msg, this.playbackStart(msg.turnId, msg.frame, at));
    } else if (msg.type === "drained" || msg.type === "cleared") {
      this.state.playing = false;
      this.state.buffered = 0;
      if (typeof msg.consumed === "number") this.state.consumed = msg.consumed;
    }
    this.dispatchEvent(new CustomEvent(msg.type, { detail: { ...msg, at } }));
  }

  // The output's own latency (ms): what the context adds after the worklet renders a sample.
  outputLatencyMs() {
    const c = this.context;
    return c ? ((c.baseLatency || 0) + (c.outputLatency || 0)) * 1000 : 0;
  }

  // Page time at which context frame `frame` leaves the output, and how it was found: from the context's output
  // timestamp ("output-timestamp") where it has a live one, else ("estimate") from when its report came (`reportAt`)
  // plus the output latency. A context that has only just started can give a stale timestamp: one placing the sample
  // before `notBefore` (it cannot play before it arrived) is not used.
  frameOutputAt(frame, reportAt, notBefore = -Infinity) {
    const c = this.context;
    const ts = c?.getOutputTimestamp?.();
    if (ts && ts.performanceTime > 0 && ts.contextTime > 0) {
      const at = ts.performanceTime + (frame / c.sampleRate - ts.contextTime) * 1000;
      if (at >= notBefore) return { at, clock: "output-timestamp" };
    }
    const ahead = c ? Math.max(0, (frame / c.sampleRate - c.currentTime) * 1000) : 0;
    return { at: reportAt + ahead + this.outputLatencyMs(), clock: "estimate" };
  }

  // {arrivedAt, playedAt, startMs, renderMs, outputLatencyMs, clock} of a turn's first sample: startMs to the output,
  // renderMs to the worklet's report that it rendered it (an upper bound of what the page itself adds); null without
  // an arrival.
  playbackStart(turnId, frame, reportAt) {
    const arrivedAt = this.arrivals.get(turnId) ?? null;
    this.arrivals.delete(turnId);
    const { at: playedAt, clock } = this.frameOutputAt(frame, reportAt, arrivedAt ?? -Infinity);
    const startMs = arrivedAt === null ? null : playedAt - arrivedAt;
    const renderMs = arrivedAt === null ? null : reportAt - arrivedAt;
    return { arrivedAt, playedAt, startMs, renderMs, outputLatencyMs: this.outputLatencyMs(), clock };
  }

  samplesToMs(samples) {
    return this.sampleRate ? (samples * 1000) / this.sampleRate : 0;
  }
}
