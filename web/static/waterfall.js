// Per-turn latency waterfall: one row per turn trace, each stage a bar against its budget,
// plus running p50/p95. Pure DOM building; knows the trace shape (docs/protocol.md, Turn trace), not the socket.
import { STAGES, percentile } from "./protocol.js";

const LABELS = {
  endpointing: "end of speech", asr: "recognition", llm_ttft: "first token", phrase: "first phrase",
  tts: "speech synthesis", send: "send", voice_to_voice: "voice to voice",
};

// The budget sits at this fraction of the track so over-budget bars have room to show how far over.
const BUDGET_AT = 0.6;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

const fmt = (ms) => (ms === null || ms === undefined || Number.isNaN(ms) ? "–" : `${Math.round(ms)} ms`);

export function stageBar(stage, valueMs, budgetMs, over) {
  const hasBudget = typeof budgetMs === "number" && budgetMs > 0;
  const fraction = hasBudget ? Math.max(0, valueMs) / budgetMs * BUDGET_AT : 0;
  const width = Math.min(1, fraction) * 100;
  const label = `${LABELS[stage] || stage}: ${fmt(valueMs)}${hasBudget ? ` of ${fmt(budgetMs)} budget` : ""}${over ? ", over budget" : ""}`;
  const track = el("div", { class: "track", role: "img", "aria-label": label },
    el("div", { class: "fill", style: `width:${width.toFixed(1)}%` }),
    hasBudget ? el("div", { class: "budget", style: `left:${BUDGET_AT * 100}%` }) : null);
  return el("div", { class: `stage${over ? " over" : ""}`, "data-stage": stage, "data-ms": String(valueMs) },
    el("span", { class: "name" }, LABELS[stage] || stage),
    track,
    el("span", { class: "value" }, fmt(valueMs), hasBudget ? el("small", {}, ` / ${Math.round(budgetMs)}`) : null,
      over ? el("strong", { class: "flag" }, " over") : null));
}

const ENDS = {
  complete: "a check heard a finished turn", max_hangover: "the longest pause a turn holds ran out",
  silence: "the fixed pause ran out", max_length: "the turn reached its longest length",
};

// How a voice turn ended, from the trace's `turn` (docs/protocol.md): the reason and what its last check said.
export function turnEnd(turn) {
  if (!turn?.end) return null;
  const parts = [`ended: ${ENDS[turn.end] || turn.end}`];
  const last = (turn.checks || []).at(-1);
  if (last?.decision === "unanswered") parts.push(`its check was still out after ${fmt(last.cost_ms)}`);
  else if (last && typeof last.complete_prob === "number") {
    parts.push(`P(finished) ${last.complete_prob.toFixed(2)} after ${fmt(last.silence_ms)} of silence (check ${fmt(last.cost_ms)})`);
  }
  return parts.join("; ");
}

// trace: {turn_id, stages_ms, budgets_ms, over_budget, turn?}; client: {micToEarMs, playbackStartMs, typed, text}
export function traceRow(trace, client = {}) {
  const stages = trace.stages_ms || {};
  const budgets = trace.budgets_ms || {};
  const over = new Set(trace.over_budget || []);
  const names = [...STAGES.filter((s) => s in stages), ...Object.keys(stages).filter((s) => !STAGES.includes(s))];
  const bars = names.map((s) => stageBar(s, stages[s], budgets[s], over.has(s) || (budgets[s] > 0 && stages[s] > budgets[s])));
  const headline = el("div", { class: "headline" },
    el("span", {}, "server voice→voice ", el("b", { "data-field": "voice_to_voice" }, fmt(stages.voice_to_voice))),
    el("span", {}, client.typed ? "client send→ear " : "client mic→ear ",
      el("b", { "data-field": "mic_to_ear" }, fmt(client.micToEarMs))),
    el("span", { title: "first reply audio in to its first sample out, on this page" }, "client playback start ",
      el("b", { "data-field": "client_playback" }, fmt(client.playbackStartMs))));
  const title = el("div", { class: "turn-title" }, el("span", {}, `Turn ${trace.turn_id}`),
    client.text ? el("span", { class: "said" }, `“${client.text}”`) : null,
    over.size ? el("span", { class: "badge" }, `${over.size} over budget`) : null);
  const ended = turnEnd(trace.turn);
  return el("li", { class: "trace", "data-turn": String(trace.turn_id) }, title, headline, el("div", { class: "stages" }, ...bars),
    ended ? el("div", { class: "turn-end", "data-field": "turn_end" }, ended) : null);
}

// Running p50/p95 over every finished turn.
export class LatencyStats {
  constructor() {
    this.voiceToVoice = [];
    this.micToEar = [];
  }

  add(trace, micToEarMs) {
    const v2v = trace.stages_ms?.voice_to_voice;
    if (typeof v2v === "number") this.voiceToVoice.push(v2v);
    if (typeof micToEarMs === "number") this.micToEar.push(micToEarMs);
  }

  summary() {
    return {
      turns: this.voiceToVoice.length,
      v2v_p50: percentile(this.voiceToVoice, 50), v2v_p95: percentile(this.voiceToVoice, 95),
      ear_p50: percentile(this.micToEar, 50), ear_p95: percentile(this.micToEar, 95),
    };
  }

  render(node) {
    const s = this.summary();
    node.textContent = "";
    node.append(
      el("span", {}, `${s.turns} turn${s.turns === 1 ? "" : "s"}`),
      el("span", {}, "voice→voice p50 ", el("b", {}, fmt(s.v2v_p50)), " p95 ", el("b", {}, fmt(s.v2v_p95))),
      el("span", {}, "mic→ear p50 ", el("b", {}, fmt(s.ear_p50)), " p95 ", el("b", {}, fmt(s.ear_p95))));
  }
}
