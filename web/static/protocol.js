// Wire protocol v1 helpers (docs/protocol.md): message builders, the binary audio header, stats.
// Pure functions only: no sockets, no DOM, no audio graph.

export const PROTOCOL_VERSION = 1;
export const MIC_SAMPLE_RATE = 16000;
export const FRAME_MS = 20;
export const FRAME_SAMPLES = (MIC_SAMPLE_RATE * FRAME_MS) / 1000; // 320 samples = 640 bytes
export const AUDIO_HEADER_BYTES = 8;

// Stage order of the turn trace (docs/protocol.md, Turn trace); the headline comes last.
export const STAGES = ["endpointing", "asr", "llm_ttft", "phrase", "tts", "send", "voice_to_voice"];

export function sessionStart({ persona = null, voice = null } = {}, resume = null, user = null) {
  // echo_cancelled: the microphone is opened with the browser's own echo canceller (mic.js)
  const msg = { type: "session.start", protocol: PROTOCOL_VERSION, sample_rate: MIC_SAMPLE_RATE, echo_cancelled: true };
  if (persona) msg.persona = persona;
  if (voice) msg.voice = voice;
  if (resume) msg.resume = resume; // a dropped connection's token: the server carries its conversation on
  if (user) msg.user = user; // who remembers what (a persona with memory)
  return msg;
}

export function sessionUpdate({ persona, voice }) {
  const msg = { type: "session.update" };
  if (persona) msg.persona = persona;
  if (voice) msg.voice = voice;
  return msg;
}

// The persona and voice to ask for again after a reconnect, once `msg` (a session.update) is sent:
// a new persona brings its own voice unless one is named too.
export function wantedAfter(wanted, msg) {
  if (msg.type !== "session.update") return wanted;
  const voice = msg.voice ?? (msg.persona ? null : wanted.voice);
  return { persona: msg.persona ?? wanted.persona, voice };
}

export const inputText = (text) => ({ type: "input.text", text });
export const responseCancel = () => ({ type: "response.cancel" });
// `client`: {startMs, underruns} the page measured of its own playback (docs/protocol.md, Client playback start).
export const playbackMark = (turnId, playedMs, paused = false, client = {}) => ({
  type: "playback.mark", turn_id: turnId, played_ms: Math.round(playedMs), ...(paused ? { paused: true } : {}),
  ...(typeof client.startMs === "number" && client.startMs >= 0 ? { start_ms: Math.round(client.startMs * 10) / 10 } : {}),
  ...(typeof client.underruns === "number" ? { underruns: client.underruns } : {}),
});

// Server audio: uint32 LE turn_id, uint32 LE seq, then PCM16LE mono at output_sample_rate.
export function parseAudioFrame(buffer) {
  if (buffer.byteLength < AUDIO_HEADER_BYTES) throw new Error(`audio frame of ${buffer.byteLength} bytes has no header`);
  const view = new DataView(buffer);
  const turnId = view.getUint32(0, true);
  const seq = view.getUint32(4, true);
  const body = buffer.slice(AUDIO_HEADER_BYTES, AUDIO_HEADER_BYTES + ((buffer.byteLength - AUDIO_HEADER_BYTES) & ~1));
  return { turnId, seq, pcm: new Int16Array(body) };
}

// Nearest-rank percentile; null for no data so the UI can show a dash.
export function percentile(values, p) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
}

// Backoff for reconnects: 0.5 s doubling to 8 s, with up to 20 % jitter so many tabs do not stampede.
export function backoffMs(attempt, random = Math.random) {
  const base = Math.min(8000, 500 * 2 ** Math.max(0, attempt));
  return Math.round(base * (1 + 0.2 * random()));
}

// WebSocket URL next to the page (works behind any mount path); carries ?token= along if the page has one.
export function socketUrl(pageHref) {
  const page = new URL(pageHref);
  const url = new URL("ws", page);
  url.protocol = page.protocol === "https:" ? "wss:" : "ws:";
  url.search = "";
  const token = page.searchParams.get("token");
  if (token) url.searchParams.set("token", token);
  url.hash = "";
  return url.toString();
}
