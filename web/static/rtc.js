// The WebRTC link (docs/protocol.md, WebRTC): one RTCPeerConnection with an Opus track each way and the
// protocol's JSON on the "parley" data channel. Same events and methods as connection.js's Connection, so
// app.js does not care which it has; when WebRTC cannot connect it becomes that socket Connection itself.
import { Connection } from "./connection.js";
import { sessionStart, wantedAfter } from "./protocol.js";
import { userId } from "./prefs.js";

const CONNECT_TIMEOUT_MS = 10000; // offer, ICE and the data channel; past it the socket is used instead
const GATHER_TIMEOUT_MS = 3000; // host candidates come at once; a slow interface is not waited for

// Which link to use: ?transport= in the address, else the last choice, else WebRTC where the browser has it.
export function chosenTransport(pageHref) {
  const asked = new URL(pageHref).searchParams.get("transport");
  let saved = null;
  try {
    saved = localStorage.getItem("parley.transport");
  } catch {
    // storage blocked: no remembered choice
  }
  const wanted = asked || saved || "webrtc";
  return wanted === "webrtc" && typeof RTCPeerConnection === "function" ? "webrtc" : "ws";
}

export function rememberTransport(transport) {
  try {
    localStorage.setItem("parley.transport", transport);
  } catch {
    // private mode: the choice lasts for this page only
  }
}

export class RtcConnection extends EventTarget {
  constructor(pageHref, socketUrl) {
    super();
    this.page = new URL(pageHref);
    this.socketUrl = socketUrl;
    this.transport = "webrtc";
    this.pc = null;
    this.channel = null;
    this.sender = null;
    this.micTrack = null;
    this.remote = null; // MediaStream of the reply
    this.audio = null; // <audio> playing it
    this.ready = null;
    this.wanted = { persona: null, voice: null };
    this.resumeToken = null;
    this.fallback = null; // the socket Connection, once WebRTC failed
    this.fallbackReason = null;
    this.stopped = true;
    this.sentBytes = 0;
    this.opens = 0;
    this.recorder = null;
    this.recorded = []; // the reply track as the page heard it (MediaRecorder chunks), for people and tests
  }

  get isReady() {
    if (this.fallback) return this.fallback.isReady;
    return this.ready !== null && this.channel?.readyState === "open";
  }

  start() {
    this.stopped = false;
    this.open().catch((err) => this.fallBack(String(err?.message || err)));
  }

  stop() {
    this.stopped = true;
    this.resumeToken = null;
    if (this.fallback) this.fallback.stop();
    this.pc?.close();
  }

  async open() {
    this.opens += 1;
    this.emit("status", { phase: "connecting", attempt: 0 });
    const pc = new RTCPeerConnection({ iceServers: await this.iceServers() });
    this.pc = pc;
    this.sender = pc.addTransceiver("audio", { direction: "sendrecv" }).sender;
    if (this.micTrack) await this.sender.replaceTrack(this.micTrack);
    pc.ontrack = (ev) => this.play(ev.streams[0] || new MediaStream([ev.track]));
    const channel = pc.createDataChannel("parley");
    this.channel = channel;
    channel.onopen = () => channel.send(JSON.stringify(sessionStart(this.wanted, this.resumeToken, userId())));
    channel.onmessage = (ev) => this.onMessage(ev.data);
    channel.onclose = () => this.closed();
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === "failed") this.closed();
    };
    const timer = setTimeout(() => {
      if (!this.ready) this.fallBack("WebRTC did not connect in time");
    }, CONNECT_TIMEOUT_MS);
    channel.addEventListener("open", () => clearTimeout(timer));
    await pc.setLocalDescription(await pc.createOffer());
    await this.gathered(pc);
    const headers = { "Content-Type": "application/json" };
    const token = this.page.searchParams.get("token");
    if (token) headers.Authorization = `Bearer ${token}`;
    const resp = await fetch(new URL("webrtc/offer", this.page), {
      method: "POST", headers, body: JSON.stringify({ type: "offer", sdp: pc.localDescription.sdp }),
    });
    const answer = await resp.json().catch(() => ({}));
    if (!resp.ok) {
      clearTimeout(timer);
      if (resp.status === 401 || resp.status === 403) {
        this.emit("message", { type: "error", code: answer.code || "unauthorized", message: answer.message || "refused", fatal: true });
        this.emit("closed", { code: 1008, reason: answer.message || "", wasReady: false, refused: true });
        this.stopped = true;
        return;
      }
      throw new Error(`the server answered the offer with ${resp.status} ${answer.code || ""}`);
    }
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
  }

  async iceServers() {
    try {
      const resp = await fetch(new URL("webrtc/config", this.page));
      return resp.ok ? (await resp.json()).ice_servers || [] : [];
    } catch {
      return [];
    }
  }

  gathered(pc) {
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => pc.iceGatheringState === "complete" && resolve();
      pc.addEventListener("icegatheringstatechange", done);
      setTimeout(resolve, GATHER_TIMEOUT_MS);
    });
  }

  play(stream) {
    this.remote = stream;
    if (!this.audio) {
      this.audio = new Audio();
      this.audio.autoplay = true;
    }
    this.audio.srcObject = stream;
    this.audio.play().catch(() => {}); // before a click the browser may hold it; resume() plays it then
    if (typeof MediaRecorder === "function" && !this.recorder) {
      this.recorder = new MediaRecorder(stream);
      this.recorder.ondataavailable = (ev) => ev.data.size && this.recorded.push(ev.data);
      this.recorder.start(500);
    }
  }

  resume() {
    if (this.fallback) return;
    this.audio?.play().catch(() => {});
  }

  async attachMic(track) {
    this.micTrack = track;
    if (this.sender) await this.sender.replaceTrack(track);
  }

  onMessage(data) {
    if (typeof data !== "string") return;
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      this.emit("protocol-error", { message: "server sent text that is not JSON" });
      return;
    }
    if (msg.type === "session.ready") {
      this.ready = msg;
      this.resumeToken = msg.resume_token ?? null; // a reconnect carries the conversation on
      this.wanted = { persona: msg.persona ?? this.wanted.persona, voice: msg.voice ?? this.wanted.voice };
    }
    this.emit("message", msg);
  }

  closed() {
    if (this.fallback || this.pc === null) return;
    const wasReady = this.ready !== null;
    this.ready = null;
    this.pc.close();
    this.pc = null;
    if (!wasReady && !this.stopped) {
      this.fallBack("the WebRTC connection failed");
      return;
    }
    this.emit("closed", { code: 1006, reason: "WebRTC closed", wasReady, refused: false });
    if (!this.stopped) setTimeout(() => this.open().catch((err) => this.fallBack(String(err?.message || err))), 1000);
  }

  // WebRTC could not connect (no route for UDP, a server without it): the socket carries everything instead.
  fallBack(reason) {
    if (this.fallback || this.stopped) return;
    this.fallbackReason = reason;
    this.transport = "ws";
    this.pc?.close();
    this.pc = null;
    const conn = new Connection(this.socketUrl);
    conn.wanted = this.wanted;
    for (const type of ["status", "message", "closed", "audio", "protocol-error"]) {
      conn.addEventListener(type, (ev) => this.emit(type, ev.detail));
    }
    this.fallback = conn;
    conn.start();
  }

  get ws() {
    return this.fallback?.ws ?? null;
  }

  send(msg) {
    if (this.fallback) return this.fallback.send(msg);
    if (this.channel?.readyState !== "open") return false;
    this.wanted = wantedAfter(this.wanted, msg);
    this.channel.send(JSON.stringify(msg));
    return true;
  }

  // The microphone goes as the media track: a frame "is sent" when the track is attached and the link up.
  sendAudio(buffer) {
    if (this.fallback) return this.fallback.sendAudio(buffer);
    if (!this.isReady || !this.micTrack) return false;
    this.sentBytes += buffer.byteLength;
    return true;
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}
