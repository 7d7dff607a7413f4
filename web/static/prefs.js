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
