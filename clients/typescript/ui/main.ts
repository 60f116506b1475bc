// Parley's reference chat page (served at /ui): every call, the stream and the state come from the client
// package (../src); this file only turns its state into DOM, following the seeds' display rules.
import {
  ChatSession,
  ParleyClient,
  ParleyHttpError,
  messageMeta,
  startsRun,
  statusLine,
  usageHeader,
  workedFor,
  type ChatItem,
  type ChatState,
  type ConnectionState,
} from "../src/index";

const KEY_STORAGE = "parley.apiKey";
const $ = <T extends HTMLElement>(id: string): T => document.getElementById(id) as T;

let client = makeClient();
let chat: ChatSession | null = null;
let scheduled = false;
let resyncedUntil = 0;

function makeClient(): ParleyClient {
  return new ParleyClient({ baseUrl: "", apiKey: sessionStorage.getItem(KEY_STORAGE) || null });
}

function describeError(error: unknown): string {
  if (error instanceof ParleyHttpError) {
    if (error.status === 401) {
      return `The API key was refused (401 ${error.code}): ${error.body?.message ?? ""} Enter a valid key on the left.`;
    }
    return `${error.status} ${error.code}: ${error.body?.message ?? error.message}`;
  }
  return error instanceof Error ? error.message : String(error);
}

function showError(error: unknown): void {
  const box = $("error");
  box.textContent = error === null ? "" : describeError(error);
  box.hidden = error === null;
}

function el(tag: string, className?: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function bubbleRow(kind: string, first: boolean, id: string, meta: string | null): { row: HTMLElement; bubble: HTMLElement } {
  const row = el("div", `message-row ${kind} ${first ? "first" : "continuation"}`);
  row.dataset.id = id;
  row.dataset.kind = kind;
  const line = el("div", "message-line");
  const bubble = el("div", "message-bubble");
  line.append(bubble);
  if (meta) line.append(el("span", "meta", meta));
  row.append(line);
  return { row, bubble };
}

function renderItem(items: ChatItem[], index: number): HTMLElement | null {
  const item = items[index] as ChatItem;
  const first = startsRun(items, index);
  const meta = messageMeta(item);
  switch (item.kind) {
    case "turn_start":
      return null;
    case "turn_done": {
      const note = workedFor(item.durationSeconds) ?? (item.status === "completed" ? null : `Turn ${item.status}`);
      if (!note) return null;
      const line = el("div", "turn-note", note);
      line.dataset.kind = "turn_done";
      return line;
    }
    case "user": {
      const { row, bubble } = bubbleRow("user", first, item.id, meta);
      bubble.textContent = item.content;
      return row;
    }
    case "assistant": {
      const { row, bubble } = bubbleRow("assistant", first, item.id, meta);
      if (first) row.prepend(el("div", "agent-name", item.model ?? "assistant"));
      bubble.textContent = item.content;
      if (item.interrupted) bubble.append(el("span", "interrupted-mark", "■ interrupted"));
      return row;
    }
    case "tool_group": {
      const { row, bubble } = bubbleRow("tool_group", first, item.id, meta);
      if (first) row.prepend(el("div", "agent-name", item.model ?? "assistant"));
      const card = el("details", "tool-card");
      const done = item.result !== null;
      card.append(el("summary", "", `⚙ ${item.toolName}${done ? (item.isError ? " ✗" : " ✓") : " …"}`));
      card.append(el("pre", "tool-args", JSON.stringify(item.arguments, null, 1)));
      if (done) card.append(el("pre", "tool-result", item.result ?? ""));
      bubble.append(card);
      if (item.interrupted) bubble.append(el("span", "interrupted-mark", "■ interrupted"));
      return row;
    }
    case "error": {
      const { row, bubble } = bubbleRow("error", first, item.id, meta);
      bubble.textContent = `${item.content} (${item.code})`;
      return row;
    }
  }
}

function renderMessages(state: ChatState): void {
  const box = $("messages");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  const nodes: HTMLElement[] = [];
  state.items.forEach((_, i) => {
    const node = renderItem(state.items, i);
    if (node) nodes.push(node);
  });
  for (const waiting of state.queue) {
    const { row, bubble } = bubbleRow("user queued", false, waiting.id, null);
    bubble.textContent = waiting.content;
    row.append(el("span", "queued-mark", "queued"));
    nodes.push(row);
  }
  for (const mine of state.optimistic) {
    const { row, bubble } = bubbleRow("user optimistic", false, mine.clientMessageId, null);
    bubble.textContent = mine.content;
    row.append(el("span", "sending-mark", mine.error ? `not sent: ${mine.error}` : "sending…"));
    nodes.push(row);
  }
  box.replaceChildren(...nodes);
  if (atBottom) box.scrollTop = box.scrollHeight;
}

function renderPending(session: ChatSession): void {
  const box = $("pending");
  const cards = session.state.approvals.map((request) => {
    const card = el("div", "approval-card");
    card.dataset.toolCallId = request.toolCallId;
    card.append(el("div", "", `Approve ${request.name}?`));
    const args = el("textarea") as HTMLTextAreaElement;
    args.value = JSON.stringify(request.arguments, null, 2);
    card.append(args);
    const act = (label: string, run: () => Promise<unknown>): void => {
      const button = el("button", "", label) as HTMLButtonElement;
      button.type = "button";
      button.onclick = () => run().catch(showError);
      card.append(button);
    };
    act("Approve", () => session.approve(request.toolCallId));
    act("Reject", () => session.reject(request.toolCallId, "rejected on the page"));
    act("Run edited", async () => session.edit(request.toolCallId, JSON.parse(args.value)));
    return card;
  });
  box.replaceChildren(...cards);
}

function renderConnection(connection: ConnectionState): void {
  const badge = $("connection");
  let status: string = connection.status;
  let text = { connecting: "connecting…", open: "live", reconnecting: "reconnecting…", closed: "closed" }[connection.status];
  if (connection.status === "open" && Date.now() < resyncedUntil) {
    status = "resynced";
    text = "resynced";
  }
  if (connection.status === "reconnecting" && connection.attempt > 0) text = `reconnecting (attempt ${connection.attempt})…`;
  if (connection.status === "closed" && connection.error) {
    const error = connection.error;
    text = error instanceof ParleyHttpError ? `closed: ${error.status} ${error.code}` : "closed: network error";
  }
  badge.dataset.status = status;
  badge.textContent = text;
  badge.title = connection.error ? describeError(connection.error) : "";
}

function render(): void {
  scheduled = false;
  if (!chat) return;
  const state = chat.state;
  $("session-title").textContent = chat.session?.title || chat.sessionId;
  renderMessages(state);
  renderPending(chat);
  renderConnection(chat.connection);
  const usage = usageHeader(state);
  const context = $("context");
  context.textContent = usage?.context ?? "";
  context.className = usage?.level ?? "";
  $("session-tokens").textContent = usage?.session ?? "";
  const line = statusLine(state);
  const statusBox = $("status-line");
  statusBox.hidden = line === null;
  statusBox.dataset.status = state.status;
  (statusBox.querySelector(".status-icon") as HTMLElement).textContent = state.status === "tool_calling" ? "⚙ " : "";
  (statusBox.querySelector(".status-text") as HTMLElement).textContent = line ?? "";
  statusBox.classList.toggle("dots", state.status === "thinking");
  // The input stays enabled; Stop shows only while the agent works (seed 004 §2.5).
  $("stop").hidden = state.status === "idle" && state.runningTurnId === null;
  if (chat.connection.status === "closed" && chat.connection.error) showError(chat.connection.error);
}

function schedule(): void {
  if (!scheduled) {
    scheduled = true;
    requestAnimationFrame(render);
  }
}

async function openSession(sessionId: string): Promise<void> {
  chat?.close();
  showError(null);
  $("messages").replaceChildren();
  $("session-title").textContent = sessionId;
  for (const li of document.querySelectorAll<HTMLElement>("#sessions li")) li.classList.toggle("active", li.dataset.id === sessionId);
  const session = new ChatSession({
    client,
    sessionId,
    onChange: schedule,
    // A person is waiting: retry at least every 5 s while the server is away (a page in the background
    // reconnects at once when it becomes visible again).
    stream: { maxDelayMs: 5_000 },
    onEvent: (event) => {
      if (event.type === "resync") resyncedUntil = Date.now() + 5000;
    },
  });
  // The demo client tool: the page answers it when a session declares it (tools issue).
  session.registerClientTool(
    "browser_info",
    { description: "The page's language and time zone.", parameters: { type: "object", properties: {} } },
    () => ({ language: navigator.language, time_zone: Intl.DateTimeFormat().resolvedOptions().timeZone }),
  );
  chat = session;
  try {
    await session.open();
  } catch (error) {
    showError(error);
  }
}

async function loadSessions(): Promise<void> {
  const page = await client.listSessions(50);
  const list = $("sessions");
  list.replaceChildren(
    ...page.sessions.map((s) => {
      const li = el("li");
      li.dataset.id = s.id;
      li.append(el("span", "", s.title || s.id), el("small", "", `${s.model} · ${new Date(s.updated_at).toLocaleString()}`));
      li.classList.toggle("active", s.id === chat?.sessionId);
      li.onclick = () => (location.hash = s.id);
      return li;
    }),
  );
}

async function loadModels(): Promise<void> {
  const { models, default_model } = await client.models();
  const select = $<HTMLSelectElement>("model");
  select.replaceChildren(
    ...models.map((m) => {
      const option = el("option", "", m.model) as HTMLOptionElement;
      option.value = m.model;
      option.selected = m.model === default_model;
      return option;
    }),
  );
}

async function start(): Promise<void> {
  showError(null);
  try {
    await Promise.all([loadModels(), loadSessions()]);
  } catch (error) {
    showError(error);
    return;
  }
  const sessionId = location.hash.slice(1);
  if (sessionId) await openSession(sessionId);
}

function wire(): void {
  const key = $<HTMLInputElement>("key");
  key.value = sessionStorage.getItem(KEY_STORAGE) ?? "";
  key.onchange = () => {
    sessionStorage.setItem(KEY_STORAGE, key.value.trim());
    client = makeClient();
    chat?.close();
    chat = null;
    void start();
  };
  $("new-session").onclick = async () => {
    try {
      const session = await client.createSession({ model: $<HTMLSelectElement>("model").value || null });
      await loadSessions();
      location.hash = session.id;
    } catch (error) {
      showError(error);
    }
  };
  const input = $<HTMLTextAreaElement>("input");
  const send = async (): Promise<void> => {
    const text = input.value.trim();
    if (!text || !chat) return;
    input.value = "";
    try {
      await chat.send(text);
      void loadSessions();
    } catch (error) {
      showError(error);
    }
  };
  $("composer").onsubmit = (event) => {
    event.preventDefault();
    void send();
  };
  input.onkeydown = (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      void send();
    }
  };
  $("stop").onclick = () => chat?.stop().catch(showError);
  window.onhashchange = () => {
    const id = location.hash.slice(1);
    if (id && id !== chat?.sessionId) void openSession(id);
  };
  document.addEventListener("visibilitychange", () => document.visibilityState === "visible" && chat?.reconnectNow());
}

wire();
void start();
