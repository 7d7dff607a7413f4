// The /ws link: opens it, sends session.start, splits JSON from binary audio, reconnects with backoff.
// Knows the protocol's framing only; what messages mean is app.js's business.
import { backoffMs, parseAudioFrame, sessionStart, wantedAfter } from "./protocol.js";
import { userId } from "./prefs.js";

// Close codes the server may use for "no room now" (1013 Try Again Later) and policy refusals.
const CLOSE_TRY_AGAIN = 1013;
const CLOSE_POLICY = 1008;

export class Connection extends EventTarget {
  constructor(url, { WebSocketImpl = WebSocket } = {}) {
    super();
    this.url = url;
    this.WebSocketImpl = WebSocketImpl;
    this.ws = null;
    this.ready = null; // the last session.ready payload while the session is up
    this.wanted = { persona: null, voice: null }; // re-sent in session.start after a reconnect
    this.resumeToken = null; // the last session.ready's: a reconnect carries the same conversation on (docs/protocol.md)
    this.attempt = 0;
    this.retryTimer = null;
    this.retryAt = null;
    this.stopped = true;
    this.sentBytes = 0;
    this.opens = 0; // connection attempts, for the page's numbers
  }

  start() {
    this.stopped = false;
    this.open();
  }

  stop() {
    this.stopped = true;
    this.resumeToken = null; // closed on purpose (1000): the server ends the conversation
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    if (this.ws) this.ws.close(1000, "client stop");
  }

  get isReady() {
    return this.ready !== null && this.ws?.readyState === WebSocket.OPEN;
  }

  open() {
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.retryAt = null;
    let ws;
    try {
      ws = new this.WebSocketImpl(this.url);
    } catch (err) {
      this.scheduleRetry({ code: 0, reason: String(err) });
      return;
    }
    this.opens += 1;
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.emit("status", { phase: "connecting", attempt: this.attempt });
    ws.onopen = () => ws.send(JSON.stringify(sessionStart(this.wanted, this.resumeToken, userId())));
    ws.onmessage = (ev) => this.onMessage(ev.data);
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      const wasReady = this.ready !== null;
      this.ready = null;
      // A policy refusal (bad token, foreign origin) will not heal by itself: stop and say so.
      const refused = ev.code === CLOSE_POLICY;
      this.emit("closed", { code: ev.code, reason: ev.reason, wasReady, refused });
      if (refused) this.stopped = true;
      if (!this.stopped) this.scheduleRetry(ev);
    };
    // onerror carries no detail in browsers; onclose always follows and does the work.
    ws.onerror = () => {};
  }

  scheduleRetry({ code }) {
    // A full server asks us to wait longer than a crashed one: start the backoff further along.
    if (code === CLOSE_TRY_AGAIN && this.attempt < 3) this.attempt = 3;
    const delay = backoffMs(this.attempt);
    this.attempt += 1;
    this.retryAt = performance.now() + delay;
    this.emit("status", { phase: "waiting", attempt: this.attempt, delayMs: delay, code });
    this.retryTimer = setTimeout(() => this.open(), delay);
  }

  onMessage(data) {
    const at = performance.now(); // audio: when it arrived (the player's playback start counts from here)
    if (data instanceof ArrayBuffer) {
      let frame;
      try {
        frame = parseAudioFrame(data);
      } catch (err) {
        this.emit("protocol-error", { message: err.message });
        return;
      }
      this.emit("audio", { ...frame, at });
      return;
    }
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      this.emit("protocol-error", { message: "server sent text that is not JSON" });
      return;
    }
    if (msg.type === "session.ready") {
      this.ready = msg;
      this.attempt = 0;
      this.resumeToken = msg.resume_token ?? null;
      this.wanted = { persona: msg.persona ?? this.wanted.persona, voice: msg.voice ?? this.wanted.voice };
    }
    this.emit("message", msg);
  }

  send(msg) {
    if (this.ws?.readyState !== WebSocket.OPEN) return false;
    this.wanted = wantedAfter(this.wanted, msg);
    this.ws.send(JSON.stringify(msg));
    return true;
  }

  sendAudio(buffer) {
    if (!this.isReady) return false;
    this.ws.send(buffer);
    this.sentBytes += buffer.byteLength;
    return true;
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

export { CLOSE_POLICY, CLOSE_TRY_AGAIN };
