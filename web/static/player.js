// Reply playback: an AudioContext at the server's output rate feeding the ring-buffer worklet.
// Holds audio back while the browser keeps sound off (no user gesture yet) and plays it once allowed.
// Turns worklet reports into page-clock events; knows nothing of the socket.

const MAX_PENDING_SAMPLES = 60 * 48000; // held-back audio beyond a minute is dropped, oldest first

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
      const context = new AudioContext({ sampleRate, latencyHint: "interactive" });
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

  push(turnId, pcm) {
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
    } else if (msg.type === "drained" || msg.type === "cleared") {
      this.state.playing = false;
      this.state.buffered = 0;
      if (typeof msg.consumed === "number") this.state.consumed = msg.consumed;
    }
    this.dispatchEvent(new CustomEvent(msg.type, { detail: { ...msg, at } }));
  }

  samplesToMs(samples) {
    return this.sampleRate ? (samples * 1000) / this.sampleRate : 0;
  }
}
