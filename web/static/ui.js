// DOM side of the page: conversation bubbles, pickers, status pills, the error banner.
// Knows element ids from index.html; knows nothing of sockets or audio.

const $ = (id) => document.getElementById(id);

export const STATE_TEXT = {
  offline: "Offline", idle: "Ready", listening: "Listening", hearing: "Hearing you",
  thinking: "Thinking", speaking: "Speaking",
};

export function setState(state) {
  const pill = $("state");
  pill.dataset.state = state;
  pill.textContent = STATE_TEXT[state] || state;
}

export function setConnection(phase, text) {
  const pill = $("conn");
  pill.dataset.phase = phase;
  pill.textContent = text;
}

export function showError(kind, text) {
  const box = $("error");
  box.dataset.kind = kind;
  box.querySelector(".text").textContent = text;
  box.hidden = false;
}

export function clearError(kind = null) {
  const box = $("error");
  if (kind === null || box.dataset.kind === kind) {
    box.hidden = true;
    box.dataset.kind = "";
  }
}

export function setPartial(text) {
  $("partial").textContent = text;
}

// Options may be plain names or objects like {name, display_name, voice, description}.
function optionOf(item) {
  if (typeof item === "string") return { value: item, label: item };
  const value = item.name ?? item.id ?? item.value;
  const extra = item.description ? ` — ${item.description}` : "";
  return { value, label: `${item.display_name ?? value}${item.display_name ? "" : extra}` };
}

export function fillPicker(id, items, selected) {
  const select = $(id);
  const keep = document.activeElement === select; // do not steal a keyboard user's place
  select.textContent = "";
  for (const item of items || []) {
    const { value, label } = optionOf(item);
    const opt = document.createElement("option");
    opt.value = value;
    opt.textContent = label;
    select.append(opt);
  }
  if (selected !== null && selected !== undefined) select.value = selected;
  select.disabled = select.options.length === 0;
  if (keep) select.focus();
}

export function setPicker(id, value) {
  if (value !== null && value !== undefined) $(id).value = value;
}

export class Conversation {
  constructor(list) {
    this.list = list;
    this.bubbles = new Map(); // `${epoch}:${role}:${turnId}` -> element
    this.epoch = 0; // a new session numbers its turns from 1 again
  }

  bubble(role, turnId, text = "") {
    const key = `${this.epoch}:${role}:${turnId}`;
    let node = this.bubbles.get(key);
    if (!node) {
      node = document.createElement("li");
      node.className = `msg ${role}`;
      node.dataset.turn = String(turnId);
      const who = document.createElement("span");
      who.className = "who";
      who.textContent = role === "user" ? "You" : "Parley";
      const body = document.createElement("span");
      body.className = "body";
      node.append(who, body);
      this.list.append(node);
      this.bubbles.set(key, node);
    }
    if (text) node.querySelector(".body").textContent = text;
    node.scrollIntoView({ block: "nearest" });
    return node;
  }

  appendText(role, turnId, delta) {
    const body = this.bubble(role, turnId).querySelector(".body");
    body.textContent += delta;
  }

  finish(turnId, { text, interrupted, spokenText }) {
    const node = this.bubble("assistant", turnId, text || undefined);
    if (interrupted) this.markInterrupted(turnId, spokenText ? ` (interrupted after “${spokenText}”)` : " (interrupted)");
  }

  // The user cut the reply off (here or on the server); a later, fuller note replaces the first.
  markInterrupted(turnId, text = " (you interrupted)") {
    const node = this.bubble("assistant", turnId);
    node.classList.add("interrupted");
    let note = node.querySelector(".note");
    if (!note) {
      note = document.createElement("span");
      note.className = "note";
      node.append(note);
    }
    if (!note.textContent || text !== " (interrupted)") note.textContent = text;
  }

  // A turn whose request a later one took over (it went on speaking): its bubbles go, the later turn shows it whole.
  drop(turnId) {
    for (const role of ["user", "assistant"]) {
      const key = `${this.epoch}:${role}:${turnId}`;
      this.bubbles.get(key)?.remove();
      this.bubbles.delete(key);
    }
  }

  // A typed turn is shown at once, before the server gives it a turn id.
  typed(text) {
    const key = `user:typed-${this.bubbles.size}`;
    const node = this.bubble("user", `typed-${this.bubbles.size}`, text);
    node.classList.add("typed");
    return key;
  }
}
