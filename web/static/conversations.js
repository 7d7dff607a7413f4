// The past conversations page: the server's kept transcripts (GET /api/conversations), read back one at a time,
// forgotten on request (DELETE). Text from the server goes in as textContent only.
const $ = (id) => document.getElementById(id);
const base = new URL("api/conversations", new URL("./", location.href));

async function api(path = "", init = {}) {
  const resp = await fetch(path ? `${base}/${encodeURIComponent(path)}` : base, init);
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(body.error?.message ?? `${resp.status} ${resp.statusText}`);
  return body;
}

function showError(err) {
  $("error").hidden = !err;
  $("error").querySelector(".text").textContent = err ? String(err.message ?? err) : "";
}

const when = (s) => (s == null ? "" : new Date(s * 1000).toLocaleString());

function item(c) {
  const li = document.createElement("li");
  li.dataset.id = c.id;
  const open = document.createElement("button");
  open.type = "button";
  open.className = "secondary";
  open.textContent = c.first_words || "(nothing said yet)";
  open.addEventListener("click", () => read(c.id).catch(showError));
  const meta = document.createElement("span");
  meta.className = "meta";
  const state = c.open ? "going on" : `ended ${when(c.ended_s)}`;
  meta.textContent = `${when(c.started_s)} · ${c.messages} messages · ${c.persona} · ${state}`;
  const del = document.createElement("button");
  del.type = "button";
  del.className = "delete";
  del.textContent = "Delete";
  del.addEventListener("click", () => forget(c.id, del).catch(showError));
  li.append(open, meta, del);
  return li;
}

async function list() {
  const { conversations } = await api();
  $("conversations").replaceChildren(...conversations.map(item));
  $("empty").hidden = conversations.length > 0;
}

async function read(id) {
  const { messages } = await api(id);
  $("pick").hidden = true;
  $("transcript").replaceChildren(...messages.map(({ role, content }) => {
    const li = document.createElement("li");
    li.className = `msg ${role === "user" ? "user" : "assistant"}`;
    li.textContent = content;
    return li;
  }));
  $("transcript").dataset.id = id;
  showError(null);
}

async function forget(id, button) {
  if (button.dataset.confirm !== "yes") { // a second click deletes: one stray click loses nothing
    button.dataset.confirm = "yes";
    button.textContent = "Delete for good?";
    return;
  }
  await api(id, { method: "DELETE" });
  if ($("transcript").dataset.id === id) $("transcript").replaceChildren();
  await list();
  showError(null);
}

list().catch(showError);
