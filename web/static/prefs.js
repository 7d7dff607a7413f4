// Remembers the persona and voice picked last time (localStorage), so a reload or reconnect keeps them.
// Knows nothing of the page or the socket.

const KEY = "parley.choice";

export function remembered() {
  try {
    const saved = JSON.parse(localStorage.getItem(KEY) || "{}");
    return { persona: saved.persona || null, voice: saved.voice || null };
  } catch {
    return { persona: null, voice: null }; // storage blocked or garbage: start from the server's default
  }
}

export function remember(persona, voice) {
  try {
    localStorage.setItem(KEY, JSON.stringify({ persona, voice }));
  } catch {
    // private mode may forbid storage; the choice then lasts for this page only
  }
}

// Who this browser's user is: a random id kept here, sent in session.start, so that a persona with memory
// remembers them in their next conversations (docs/protocol.md, Memory). null where storage is blocked.
export function userId() {
  try {
    let id = localStorage.getItem("parley.user");
    if (!id) {
      id = Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");
      localStorage.setItem("parley.user", id);
    }
    return id;
  } catch {
    return null;
  }
}
