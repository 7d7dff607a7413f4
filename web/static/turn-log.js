// What the page knows of each turn of the conversation (its text, when the user stopped or typed, when its reply
// was first heard, its trace), and the latency table drawn from all of them. Turn ids restart with each session,
// so a new session starts a new log; earlier sessions' turns still count for the percentiles.

import { LatencyStats, traceRow } from "./waterfall.js";

export class TurnLog {
  constructor(tracesList, latencyBox) {
    this.tracesList = tracesList;
    this.latencyBox = latencyBox;
    this.latency = new LatencyStats();
    this.turns = new Map(); // turnId -> {text, typed, voiceEndAt, typedAt, firstPlayedAt, micToEarMs, playbackStartMs, underruns, trace}
    this.past = []; // turns of earlier sessions (before a reconnect)
    this.epoch = 0; // sessions seen
    this.pendingTyped = null; // {text, at}: typed text the server has not numbered yet
  }

  newSession() {
    this.epoch += 1;
    this.past.push(...this.turns.values());
    this.turns = new Map();
    this.pendingTyped = null;
  }

  typed(text, at) {
    this.pendingTyped = { text, at };
  }

  get(turnId) {
    return this.turns.get(turnId);
  }

  // The turn `turnId`, made on first mention; typed text waiting for a number becomes this turn's.
  turn(turnId) {
    let t = this.turns.get(turnId);
    if (!t) {
      t = { text: null, typed: false, voiceEndAt: null, typedAt: null, firstPlayedAt: null, micToEarMs: null, playbackStartMs: null, underruns: 0, trace: null };
      if (this.pendingTyped) {
        t.typed = true;
        t.typedAt = this.pendingTyped.at;
        t.text = this.pendingTyped.text;
        this.pendingTyped = null;
      }
      this.turns.set(turnId, t);
    }
    return t;
  }

  // (Re)draw the turn's waterfall row and the percentiles over every turn so far.
  render(turnId) {
    const t = this.turns.get(turnId);
    if (!t?.trace) return;
    const row = traceRow(t.trace, { micToEarMs: t.micToEarMs, playbackStartMs: t.playbackStartMs, typed: t.typed, text: t.text });
    row.dataset.epoch = String(this.epoch);
    const old = this.tracesList.querySelector(`li[data-epoch="${this.epoch}"][data-turn="${turnId}"]`);
    if (old) old.replaceWith(row);
    else this.tracesList.prepend(row);
    const latency = this.latency;
    latency.voiceToVoice = [];
    latency.micToEar = [];
    // Typed turns have no mic: their send-to-ear time stays out of the mic-to-ear percentiles.
    for (const x of [...this.past, ...this.turns.values()]) if (x.trace) latency.add(x.trace, x.typed ? undefined : x.micToEarMs ?? undefined);
    latency.render(this.latencyBox);
  }
}
