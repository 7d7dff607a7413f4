// Reply playback: an AudioContext at the server's output rate feeding the ring-buffer worklet.
// Turns worklet reports into page-clock events; knows nothing of the socket.

export class Player extends EventTarget {
  constructor() {
    super();
    this.context = null;
    this.node = null;
    this.sampleRate = null;
    this.state = { turnId: null, playing: false, buffered: 0, totalPlayed: 0, audible: 0, peak: 0, rms: 0, turnPlayed: 0 };
  }

  // Must run inside a user gesture the first time (autoplay policy); later calls are cheap.
  async ensure(sampleRate) {
    if (this.context && this.sampleRate === sampleRate) {
      if (this.context.state !== "running") await this.context.resume();
      return;
    }
    if (this.context) await this.context.close();
    this.sampleRate = sampleRate;
    this.context = new AudioContext({ sampleRate, latencyHint: "interactive" });
    await this.context.audioWorklet.addModule(new URL("./player-worklet.js", import.meta.url));
    this.node = new AudioWorkletNode(this.context, "parley-player", { numberOfInputs: 0, outputChannelCount: [1] });
    this.node.port.onmessage = (ev) => this.onReport(ev.data);
    this.node.connect(this.context.destination);
    await this.context.resume();
  }

  get ready() {
    return this.node !== null;
  }

  push(turnId, pcm) {
    if (!this.node) return false;
    const copy = pcm.slice(); // transfer our own copy; the caller's view may share a buffer
    this.node.port.postMessage({ type: "push", turnId, pcm: copy.buffer }, [copy.buffer]);
    return true;
  }

  clear(reason) {
    if (!this.node) return;
    this.clearRequestedAt = performance.now();
    this.node.port.postMessage({ type: "clear", reason });
  }

  onReport(msg) {
    const at = performance.now();
    if (msg.type === "progress") {
      Object.assign(this.state, msg);
    } else if (msg.type === "started") {
      this.state.playing = true;
      this.state.turnId = msg.turnId;
    } else if (msg.type === "drained" || msg.type === "cleared") {
      this.state.playing = false;
    }
    this.dispatchEvent(new CustomEvent(msg.type, { detail: { ...msg, at } }));
  }

  samplesToMs(samples) {
    return this.sampleRate ? (samples * 1000) / this.sampleRate : 0;
  }

  async close() {
    if (this.context) await this.context.close();
    this.context = null;
    this.node = null;
    this.sampleRate = null;
  }
}
