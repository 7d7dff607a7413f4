// Parley in the browser: wires the socket, microphone, player and page together.
// Owns turn bookkeeping (who said what, when the reply was first heard) and client-side barge-in.
import { Connection, CLOSE_TRY_AGAIN } from "./connection.js";
import { startMic } from "./mic.js";
import { Player } from "./player.js";
import { inputText, playbackMark, responseCancel, sessionStart, sessionUpdate, socketUrl } from "./protocol.js";
import { remember, remembered } from "./prefs.js";
import { SpeechRun } from "./speech-run.js";
import * as ui from "./ui.js";
import { TurnLog } from "./turn-log.js";
import { RtcConnection, chosenTransport, rememberTransport } from "./rtc.js";

const BARGE_IN_MS = 200; // server unreachable: voiced mic time during playback before we stop the reply ourselves
const UNHEARD_RELEASE_MS = 400; // a hold the server never took up (it heard no speech) ends this long after ours
const MAX_HOLD_MS = 4000; // a hold whose decision never came (the server is gone) ends anyway
const MARK_EVERY_MS = 250; // playback.mark cadence while a reply plays
const THINKING_GIVE_UP_MS = 15000; // speech that never became a turn (noise) stops showing "thinking"

const $ = (id) => document.getElementById(id);
// WebRTC where the browser has it (and it connects: else RtcConnection falls back to the socket by itself)
const conn = chosenTransport(location.href) === "webrtc"
  ? new RtcConnection(location.href, socketUrl(location.href))
  : new Connection(socketUrl(location.href));
conn.wanted = remembered();
const player = new Player();
const conversation = new ui.Conversation($("conversation"));
const log = new TurnLog($("traces"), $("latency"));
const latency = log.latency;

let cancelled = new Set(); // turn ids whose audio we drop (barge-in or server clear)
let sessionId = null;
let mic = null;
let micStarting = false;
let hearing = false; // the server's VAD says the user is talking
let awaiting = false; // a user turn ended and no reply audio has played yet
let awaitingSince = 0;
let lastVoicedAt = null; // page clock of the last voiced mic frame sent
let utteranceEndAt = null; // lastVoicedAt frozen when the server's VAD ends the utterance
let joining = null; // the earlier turn whose request the speech being heard continues (vad.speech_started joins)
const speech = new SpeechRun();
let pendingCut = null; // {turnId, speechAt, heldAt, serverHeard, quietSince}: playback paused on speech, the server decides
let lastMarkAt = 0;

// Numbers for people and tests: the player's output level and counts, first-played times, barge-ins.
const stats = {
  framesSent: 0, voicedFramesSent: 0, micRms: 0,
  playedSamples: 0, audibleSamples: 0, peak: 0, maxPeak: 0, outputRate: null,
  firstPlayed: {}, micToEar: {}, playbackStart: {}, underruns: {}, turnAudio: {}, receivedS: {}, bargeIns: [], clears: [], errors: [], connections: [], done: [], holds: 0, releases: 0, resumes: [],
};
window.parleyStats = stats;
window.parley = { conn, player, latency, stats, turn: (id) => log.get(id) };

function expectReply() {
  awaiting = true;
  awaitingSince = performance.now();
}

function refreshState() {
  if (awaiting && performance.now() - awaitingSince > THINKING_GIVE_UP_MS) awaiting = false;
  let state;
  if (!conn.isReady) state = "offline";
  else if (player.state.playing) state = "speaking";
  else if (hearing) state = "hearing";
  else if (awaiting) state = "thinking";
  else state = mic ? "listening" : "idle";
  ui.setState(state);
  $("start").disabled = !!mic || micStarting;
  $("stop").disabled = !mic && !player.state.playing;
  $("send").disabled = !conn.isReady;
}

// --- server messages -------------------------------------------------------------------------

const handlers = {
  "session.ready"(msg) {
    ui.clearError();
    if (msg.session_id !== sessionId) {
      // A new session (first connect or after a reconnect) numbers turns from 1 again.
      sessionId = msg.session_id;
      log.newSession();
      conversation.epoch = log.epoch;
      cancelled = new Set();
      pendingCut = null;
    }
    ui.fillPicker("persona", msg.personas, msg.persona);
    ui.fillPicker("voice", msg.voices, msg.voice);
    stats.outputRate = msg.output_sample_rate;
    stats.transport = conn.transport ?? "ws";
    $("transport").value = stats.transport;
    stats.sessionId = msg.session_id;
    stats.persona = msg.persona;
    stats.voice = msg.voice;
    // Ready the player now; the browser may hold sound until the first click, and the greeting waits for it.
    const open = navigator.userActivation?.hasBeenActive ? player.ensure(msg.output_sample_rate) : player.prepare(msg.output_sample_rate);
    open.catch(onAudioError);
  },
  "session.updated"(msg) {
    ui.setPicker("persona", msg.persona);
    ui.setPicker("voice", msg.voice);
    remember(msg.persona, conn.wanted.voice);
    stats.persona = msg.persona ?? stats.persona;
    stats.voice = msg.voice ?? stats.voice;
  },
  "vad.speech_started"(msg) {
    hearing = true;
    if (!$("partial").textContent) ui.setPartial("…");
    // Speech under a reply: the server holds it too and decides from the words (a backchannel resumes it).
    // (Only what still plays here: a reply this page has finished playing has nothing left to hold.)
    const audible = player.state.held || player.state.playing || player.state.buffered > 0;
    if (msg.holds !== undefined && !cancelled.has(msg.holds) && audible && player.state.turnId === msg.holds) {
      holdReply(msg.holds, performance.now(), true);
    }
  },
  "turn.joined"(msg) {
    joining = msg.joins;
  },
  "response.resumed"(msg) {
    if (pendingCut && pendingCut.turnId === msg.turn_id) {
      pendingCut = null;
      player.release();
      stats.resumes.push({ turnId: msg.turn_id, reason: msg.reason, at: performance.now() });
    }
  },
  "vad.speech_ended"() {
    hearing = false;
    utteranceEndAt = lastVoicedAt;
    expectReply();
  },
  "transcript.partial"(msg) {
    ui.setPartial(msg.text);
  },
  "transcript.final"(msg) {
    const t = log.turn(msg.turn_id);
    t.text = msg.text;
    if (!t.typed) t.voiceEndAt = utteranceEndAt ?? lastVoicedAt;
    ui.setPartial("");
    if (joining !== null && msg.turn_id !== joining) {
      conversation.drop(joining); // this turn holds the whole request now
      joining = null;
    }
    if (!t.typed && msg.text) conversation.bubble("user", msg.turn_id, msg.text);
    expectReply();
    hearing = false;
  },
  "response.text.delta"(msg) {
    log.turn(msg.turn_id);
    if (!cancelled.has(msg.turn_id)) conversation.appendText("assistant", msg.turn_id, msg.text);
  },
  "response.audio.clear"(msg) {
    if (cancelled.has(msg.turn_id)) return; // we stopped it ourselves already
    const audible = player.state.held || player.state.playing || player.state.buffered > 0;
    if (audible) cutReply("server", msg.turn_id, performance.now());
    else cancelled.add(msg.turn_id);
  },
  "response.done"(msg) {
    log.turn(msg.turn_id);
    conversation.finish(msg.turn_id, { text: msg.text, interrupted: msg.interrupted, spokenText: msg.spoken_text });
    stats.done.push({ turnId: msg.turn_id, interrupted: !!msg.interrupted, at: performance.now() });
    awaiting = false;
  },
  "turn.trace"(msg) {
    log.turn(msg.turn_id).trace = msg;
    log.render(msg.turn_id);
  },
  error(msg) {
    stats.errors.push({ code: msg.code, message: msg.message, fatal: !!msg.fatal, at: performance.now() });
    const code = String(msg.code || "");
    if (!conn.ready && /unknown_(persona|voice)/.test(code)) {
      // The remembered choice is gone from this server: forget it and start with its default.
      remember(null, null);
      conn.wanted = { persona: null, voice: null };
      conn.send(sessionStart());
      return;
    }
    if (/full|capacity|busy|too_many/i.test(code)) {
      ui.showError("full", "Parley is busy: all conversation slots on the server are taken. We'll try again in a moment.");
    } else if (/auth|token|origin/i.test(code)) {
      ui.showError("auth", `The server refused this page (${msg.message}). Check the access token in the address.`);
    } else {
      ui.showError(msg.fatal ? "fatal" : "server", msg.message || `Server error: ${code}`);
    }
  },
};

conn.addEventListener("message", (ev) => {
  const msg = ev.detail;
  handlers[msg.type]?.(msg);
  refreshState();
});

conn.addEventListener("audio", (ev) => {
  const { turnId, pcm } = ev.detail;
  if (cancelled.has(turnId)) return;
  const t = log.turn(turnId);
  if (!t.typed && t.voiceEndAt === null && !t.text) awaiting = false; // e.g. a greeting
  stats.receivedS[turnId] = (stats.receivedS[turnId] ?? 0) + player.samplesToMs(pcm.length) / 1000;
  player.push(turnId, pcm, ev.detail.at);
});

conn.addEventListener("status", (ev) => {
  const { phase, delayMs } = ev.detail;
  if (phase === "connecting") ui.setConnection("connecting", "Connecting…");
  else ui.setConnection("waiting", `Reconnecting in ${Math.ceil(delayMs / 1000)} s`);
});

conn.addEventListener("message", (ev) => {
  if (ev.detail.type !== "session.ready") return;
  const again = stats.connections.length > 0;
  stats.connections.push({ at: performance.now(), sessionId: ev.detail.session_id, resumed: Boolean(ev.detail.resumed) });
  // after a drop, say whether the conversation went on (resumed) or a new one began (too late: a new greeting)
  ui.setConnection("up", !again ? "Connected" : ev.detail.resumed ? "Reconnected: conversation resumed" : "Reconnected: new conversation");
});

conn.addEventListener("closed", (ev) => {
  const { code, wasReady, refused } = ev.detail;
  hearing = false;
  awaiting = false;
  player.clear("disconnect");
  stats.errors.push({ code: `close_${code}`, at: performance.now() });
  if (refused) {
    ui.setConnection("refused", "Refused");
    if ($("error").dataset.kind !== "auth") ui.showError("auth", "The server refused this page. Check the access token in the address (?token=…).");
  } else if (code === CLOSE_TRY_AGAIN) {
    ui.showError("full", "Parley is busy: all conversation slots on the server are taken. We'll try again in a moment.");
  } else if ($("error").dataset.kind !== "full") {
    ui.showError("gone", wasReady
      ? "Lost the connection to the Parley server. It may be restarting; reconnecting by itself…"
      : "Can't reach the Parley server. Is it running? Retrying by itself…");
  }
  refreshState();
});

// --- microphone ------------------------------------------------------------------------------

function onMicFrame(frame) {
  const now = performance.now();
  stats.micRms = frame.rms;
  if (conn.sendAudio(frame.pcm)) {
    stats.framesSent += 1;
    if (frame.voiced) {
      stats.voicedFramesSent += 1;
      lastVoicedAt = now;
    }
  }
  // Speech under a reply pauses playback at once (the first voiced frame); the server hears what it says and
  // either stops the reply (response.audio.clear) or resumes it (response.resumed). Only a server that is not
  // there to decide leaves it to us: then BARGE_IN_MS of speech stops the reply here, as a fallback.
  speech.push(frame, now);
  const turnId = player.state.turnId;
  const replyAudible = player.state.held || player.state.playing || player.state.buffered > 0;
  if (!replyAudible || turnId === null || cancelled.has(turnId)) {
    if (pendingCut && player.state.held) player.release();
    pendingCut = null;
    return;
  }
  if (speech.voicedMs > 0) {
    holdReply(turnId, speech.startedAt ?? now, false);
    pendingCut.quietSince = null;
  } else if (pendingCut && pendingCut.quietSince === null) {
    pendingCut.quietSince = now;
  }
  if (!pendingCut) return;
  if (!conn.isReady && speech.voicedMs >= BARGE_IN_MS) {
    cutReply("client", turnId, now);
  } else if ((!pendingCut.serverHeard && pendingCut.quietSince !== null && now - pendingCut.quietSince >= UNHEARD_RELEASE_MS)
             || now - pendingCut.speechAt >= MAX_HOLD_MS) {
    pendingCut = null; // the server heard no speech in it (or never answered): the reply goes on
    player.release();
  }
}

function holdReply(turnId, speechAt, serverHeard) {
  if (!pendingCut || pendingCut.turnId !== turnId) pendingCut = { turnId, speechAt, heldAt: null, serverHeard, quietSince: null };
  pendingCut.serverHeard ||= serverHeard;
  if (!player.state.held) player.hold();
}

// Ends a reply the user talked over, decided here or by the server's VAD (whichever came first).
// Timed from the speech onset; the stop is when playback paused, else when the worklet emptied.
function cutReply(source, turnId, decidedAt) {
  cancelled.add(turnId);
  const held = pendingCut?.turnId === turnId ? pendingCut : null;
  const speechAt = held ? held.speechAt : speech.startedAt;
  const stoppedAt = held?.heldAt ?? null;
  const stopMs = stoppedAt !== null && speechAt !== null ? stoppedAt - speechAt : null;
  stats.bargeIns.push({ source, turnId, speechAt, voicedAt: speech.voicedAt, decidedAt, stoppedAt, stopMs });
  pendingCut = null;
  stopPlayback(source, turnId);
  conversation.markInterrupted(turnId);
}

async function startTalking() {
  if (mic || micStarting) return;
  micStarting = true;
  refreshState();
  try {
    if (conn.ready) await player.ensure(conn.ready.output_sample_rate).catch(onAudioError);
    mic = await startMic(onMicFrame);
    if (conn.attachMic) await conn.attachMic(mic.stream.getAudioTracks()[0]); // WebRTC: the mic is the media track
    conn.resume?.();
    ui.clearError("mic");
  } catch (err) {
    ui.showError("mic", err.message);
    stats.errors.push({ code: `mic_${err.kind || "error"}`, message: err.message, at: performance.now() });
  } finally {
    micStarting = false;
    refreshState();
  }
}

function cancelReply() {
  if (!(player.state.playing || player.state.buffered > 0)) return;
  const turnId = player.state.turnId;
  if (turnId !== null) cancelled.add(turnId);
  conn.send(responseCancel());
  stopPlayback("user", turnId);
}

async function stopTalking() {
  cancelReply();
  if (mic) {
    const m = mic;
    mic = null;
    await m.stop();
  }
  refreshState();
}

// --- playback --------------------------------------------------------------------------------

function stopPlayback(reason, turnId) {
  stats.clears.push({ reason, turnId, requestedAt: performance.now(), stoppedAt: null });
  player.clear(reason);
}

// Per-turn numbers of what was actually played: seconds and the share of energy above 5.5 kHz
// (a wideband voice vs a narrowband one: how a test hears that the voice changed).
function noteTurnAudio(turnId, playedSamples, hfRatio) {
  if (turnId === null || turnId === undefined || hfRatio === undefined) return;
  stats.turnAudio[turnId] = { playedS: player.samplesToMs(playedSamples) / 1000, hfRatio };
}

function sendMark(turnId, samples, paused = false, startMs = null) {
  if (turnId === null || turnId === undefined) return;
  conn.send(playbackMark(turnId, player.samplesToMs(samples), paused, { startMs, underruns: stats.underruns[turnId] }));
  lastMarkAt = performance.now();
}

player.addEventListener("started", (ev) => {
  const { turnId, at, startMs, renderMs, outputLatencyMs, targetMs, clock } = ev.detail;
  const t = log.turn(turnId);
  let firstStartMs = null;
  if (t.firstPlayedAt === null) {
    t.firstPlayedAt = at;
    // the client's own share: first audio message in to first sample out (docs/protocol.md, Client playback start)
    if (typeof startMs === "number") {
      firstStartMs = t.playbackStartMs = startMs;
      stats.playbackStart[turnId] = { startMs, renderMs, outputLatencyMs, targetMs, clock };
      stats.underruns[turnId] = 0;
      log.render(turnId);
    }
    stats.firstPlayed[turnId] = at;
    const from = t.typed ? t.typedAt : t.voiceEndAt;
    if (from !== null && (t.typed || t.text)) {
      t.micToEarMs = at - from;
      stats.micToEar[turnId] = t.micToEarMs;
      log.render(turnId);
    }
  }
  awaiting = false;
  sendMark(turnId, 0, false, firstStartMs);
  refreshState();
});

player.addEventListener("underrun", (ev) => {
  const { turnId, underruns } = ev.detail;
  stats.underruns[turnId] = underruns;
  const t = log.get(turnId);
  if (t) t.underruns = underruns;
});

player.addEventListener("progress", (ev) => {
  const d = ev.detail;
  stats.playedSamples = d.totalPlayed;
  stats.audibleSamples = d.audible;
  stats.peak = d.peak;
  stats.maxPeak = Math.max(stats.maxPeak, d.peak);
  noteTurnAudio(d.turnId, d.turnPlayed, d.hfRatio);
  if (d.playing && d.at - lastMarkAt >= MARK_EVERY_MS) sendMark(d.turnId, d.turnPlayed);
});

for (const type of ["drained", "ended"]) {
  player.addEventListener(type, (ev) => {
    noteTurnAudio(ev.detail.turnId, ev.detail.playedSamples, ev.detail.hfRatio);
    sendMark(ev.detail.turnId, ev.detail.playedSamples);
    refreshState();
  });
}

// The server's echo canceller follows what plays: a mark where playback pauses, and one where it goes on.
player.addEventListener("held", (ev) => {
  stats.holds += 1;
  if (pendingCut && pendingCut.heldAt === null) pendingCut.heldAt = ev.detail.at;
  sendMark(player.state.turnId, player.state.turnPlayed, true);
});
player.addEventListener("released", () => {
  stats.releases += 1;
  if (player.state.playing) sendMark(player.state.turnId, player.state.turnPlayed);
});

player.addEventListener("cleared", (ev) => {
  const { at, turnId, playedSamples } = ev.detail;
  for (const c of stats.clears) if (c.stoppedAt === null) c.stoppedAt = at;
  for (const b of stats.bargeIns) {
    if (b.stoppedAt === null && b.speechAt !== null) {
      b.stoppedAt = at;
      b.stopMs = b.speechAt === null ? null : at - b.speechAt;
    }
  }
  sendMark(turnId, playedSamples);
  refreshState();
});

const onAudioError = (err) => ui.showError("audio", `Sound output could not start (${err.message}). Click Start to try again.`);

// --- page controls ---------------------------------------------------------------------------

$("start").addEventListener("click", startTalking);
$("stop").addEventListener("click", stopTalking);

$("transport").addEventListener("change", (ev) => {
  rememberTransport(ev.target.value);
  const url = new URL(location.href);
  url.searchParams.set("transport", ev.target.value);
  location.assign(url.toString());
});
$("persona").addEventListener("change", (ev) => conn.send(sessionUpdate({ persona: ev.target.value })));
$("voice").addEventListener("change", (ev) => conn.send(sessionUpdate({ voice: ev.target.value })));

$("typed").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const box = $("text");
  const text = box.value.trim();
  if (!text || !conn.isReady) return;
  if (conn.ready) await player.ensure(conn.ready.output_sample_rate).catch(onAudioError);
  conn.resume?.();
  log.typed(text, performance.now());
  conn.send(inputText(text));
  conversation.typed(text);
  expectReply();
  box.value = "";
  refreshState();
});

document.addEventListener("keydown", (ev) => {
  // Escape stops the reply from anywhere on the page, like the Stop button.
  if (ev.key === "Escape") cancelReply();
});

setInterval(refreshState, 250); // the player's progress changes state without a message
ui.setConnection("connecting", "Connecting…");
refreshState();
conn.start();
