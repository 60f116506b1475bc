// Parley's reference chat page (served at /ui): every call, the stream and the state come from the client
// package (../src); this file only turns its state into DOM, following the seeds' display rules.
import {
  ChatSession,
  ParleyClient,
  ParleyHttpError,
  formatDuration,
  messageMeta,
  startsRun,
  statusLine,
  usageHeader,
  workedFor,
  type ApprovalDecision,
  type Attachment,
  type ChatItem,
  type ChatState,
  type ClientToolDeclaration,
  type ConnectionState,
  type PendingApproval,
  siblingTurn,
} from "../src/index";
import { checkArguments } from "./arguments";

const KEY_STORAGE = "parley.apiKey";
const $ = <T extends HTMLElement>(id: string): T => document.getElementById(id) as T;

let client = makeClient();
let chat: ChatSession | null = null;
let scheduled = false;
let resyncedUntil = 0;
// The JSON schema of each server tool (GET /v1/tools), for checking edited arguments before they are sent.
let toolSchemas = new Map<string, unknown>();

/** The demo client tool: every session this page creates declares it, and the page answers it itself. */
const BROWSER_TIME: ClientToolDeclaration = {
  name: "get_browser_time",
  description: "The current time, time zone and language of the user's browser.",
  parameters: { type: "object", properties: {}, additionalProperties: false },
};

function browserTime(): Record<string, string> {
  const now = new Date();
  return {
    time: now.toLocaleTimeString(),
    time_zone: Intl.DateTimeFormat().resolvedOptions().timeZone,
    language: navigator.language,
    utc: now.toISOString(),
  };
}

function makeClient(): ParleyClient {
  return new ParleyClient({ baseUrl: "", apiKey: sessionStorage.getItem(KEY_STORAGE) || null });
}

// The width under which the sidebar is a drawer behind ☰ (the same as style.css's @media rule).
const NARROW = "(max-width: 720px)";

/** Where the key field is, in words that hold on the screen the person has. */
function keyField(): string {
  return matchMedia(NARROW).matches ? "the API key field of the menu (☰ at the top left)" : "the API key field on the left";
}

function describeError(error: unknown): string {
  if (error instanceof ParleyHttpError) {
    if (error.status === 401 && !client.apiKey) {
      return `This server needs an API key. Enter yours in ${keyField()}, then create or pick a session.`;
    }
    if (error.status === 401) {
      return `The API key was refused (401 ${error.code}): ${error.body?.message ?? ""} Enter a valid key in ${keyField()}.`;
    }
    return `${error.status} ${error.code}: ${error.body?.message ?? error.message}`;
  }
  return error instanceof Error ? error.message : String(error);
}

/** Text with the service's `code` spans (its messages are written for a terminal) as <code>, never as
 * literal backticks. */
function withCode(text: string): Node[] {
  return text.split(/`([^`]+)`/).map((part, i) => (i % 2 ? el("code", "", part) : document.createTextNode(part)));
}

function showError(error: unknown): void {
  const box = $("error");
  box.replaceChildren(...(error === null ? [] : withCode(describeError(error))));
  box.hidden = error === null;
}

/** The sidebar as a drawer on a narrow screen (CSS decides when; on a wide one it is always shown). */
function setMenu(open: boolean): void {
  document.body.classList.toggle("menu-open", open);
  $("menu").setAttribute("aria-expanded", String(open));
  $("backdrop").hidden = !open;
}

function el(tag: string, className?: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Thumbnails: the bytes are fetched once with the page's key (an <img src> cannot send it) and shown as a
// data: URL (the page's policy allows data: images, not blob: ones), kept for the page's life.
const thumbnails = new Map<string, Promise<string>>();

function dataUrl(blob: Blob): Promise<string> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}

function thumbnail(fileId: string): Promise<string> {
  let url = thumbnails.get(fileId);
  if (!url) {
    url = client.fileContent(fileId).then(dataUrl);
    url.catch(() => thumbnails.delete(fileId));
    thumbnails.set(fileId, url);
  }
  return url;
}

function attachmentsView(attachments: Attachment[]): HTMLElement | null {
  if (!attachments.length) return null;
  const box = el("div", "attachments");
  for (const file of attachments) {
    if (file.media_type.startsWith("image/")) {
      const image = el("img", "thumbnail") as HTMLImageElement;
      image.alt = file.name;
      image.title = file.width ? `${file.name} (${file.width}×${file.height})` : file.name;
      image.dataset.fileId = file.file_id;
      thumbnail(file.file_id).then((url) => (image.src = url), () => undefined);
      box.append(image);
    } else {
      box.append(el("span", "attachment-chip", file.name));
    }
  }
  return box;
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

const DECIDED: Record<string, string> = {
  approve: "approved",
  edit: "approved with edits",
  reject: "rejected",
  expired: "approval timed out",
  interrupted: "interrupted",
};

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
      const files = attachmentsView(item.attachments);
      if (files) row.prepend(files); // above the bubble, apart from its text
      return row;
    }
    case "assistant": {
      const { row, bubble } = bubbleRow("assistant", first, item.id, meta);
      if (first) row.prepend(el("div", "agent-name", item.model ?? "assistant"));
      bubble.textContent = item.content;
      if (item.interrupted) bubble.append(el("span", "interrupted-mark", "■ interrupted"));
      return row;
    }
    case "reasoning": {
      // Collapsed: the reasoning is not the answer (docs/events.md, reasoning_delta).
      const { row, bubble } = bubbleRow("reasoning", first, item.id, meta);
      if (first) row.prepend(el("div", "agent-name", item.model ?? "assistant"));
      const block = el("details", "thinking");
      const took = item.durationMs !== null ? ` for ${formatDuration(item.durationMs)}` : "";
      block.append(el("summary", "", item.streaming ? "Thinking…" : `Thought${took}`));
      block.append(el("pre", "thinking-text", item.content));
      bubble.append(block);
      if (item.interrupted) bubble.append(el("span", "interrupted-mark", "■ interrupted"));
      return row;
    }
    case "tool_group": {
      const { row, bubble } = bubbleRow("tool_group", first, item.id, meta);
      if (first) row.prepend(el("div", "agent-name", item.model ?? "assistant"));
      const card = el("details", "tool-card");
      const done = item.result !== null;
      const decided = item.decision ? ` · ${DECIDED[item.decision] ?? item.decision}${item.reason ? `: ${item.reason}` : ""}` : "";
      card.append(el("summary", "", `⚙ ${item.toolName}${done ? (item.isError ? " ✗" : " ✓") : " …"}${decided}`));
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

// Whether the conversation follows its newest message: true until the person scrolls up, so that an approval
// card, the status line or a smaller viewport (a phone's keyboard) never hides the message that just came.
let following = true;

function follow(): void {
  const box = $("messages");
  if (following) box.scrollTop = box.scrollHeight;
}

function branchButton(action: string, label: string, title: string, run: () => Promise<unknown>): HTMLElement {
  const button = el("button", `branch-${action}`, label) as HTMLButtonElement;
  button.type = "button";
  button.title = title;
  button.dataset.action = action;
  button.onclick = () => {
    button.disabled = true;
    run().then(
      () => showError(null),
      (error: unknown) => {
        button.disabled = false;
        showError(error);
      },
    );
  };
  return button;
}

/** Under a turn's first user message: edit it, and "< i/n >" through the turn's siblings (docs/api.md,
 * Branches). Under the last answer: regenerate it. Each asks the server; branch_changed brings the new path. */
function branchControls(session: ChatSession, state: ChatState, turnId: string, content: string): HTMLElement {
  const controls = el("div", "branch-controls");
  controls.dataset.turnId = turnId;
  const branch = state.branches[turnId];
  if (branch && branch.siblings.length > 1) {
    const before = siblingTurn(state, turnId, -1);
    const after = siblingTurn(state, turnId, 1);
    const previous = branchButton("previous", "<", "The previous version", () => session.activate(before ?? turnId));
    const next = branchButton("next", ">", "The next version", () => session.activate(after ?? turnId));
    (previous as HTMLButtonElement).disabled = before === null;
    (next as HTMLButtonElement).disabled = after === null;
    controls.append(previous, el("span", "branch-position", `${branch.index + 1}/${branch.siblings.length}`), next);
  }
  if (state.runningTurnId === null) {
    controls.append(
      branchButton("edit", "edit", "Edit this message and send it again", async () => {
        const edited = window.prompt("Edit your message", content);
        if (edited !== null && edited.trim()) await session.editMessage(turnId, edited);
      }),
    );
  }
  return controls;
}

function renderMessages(state: ChatState): void {
  const box = $("messages");
  const nodes: HTMLElement[] = [];
  // The turn of each item, and the last answer (regenerated from its turn when no turn runs).
  let turnId: string | null = null;
  let lastAnswer: { node: HTMLElement; turnId: string } | null = null;
  const controlled = new Set<string>();
  state.items.forEach((item, i) => {
    if (item.kind === "turn_start") turnId = item.turnId;
    const node = renderItem(state.items, i);
    if (!node) return;
    nodes.push(node);
    if (chat && turnId !== null && item.kind === "user" && !controlled.has(turnId)) {
      controlled.add(turnId);
      node.append(branchControls(chat, state, turnId, item.content));
    }
    if (turnId !== null && item.kind === "assistant") lastAnswer = { node, turnId };
  });
  const answered = lastAnswer as { node: HTMLElement; turnId: string } | null;
  if (chat && answered && state.runningTurnId === null) {
    const session = chat;
    const controls = el("div", "branch-controls");
    controls.append(
      branchButton("regenerate", "↻ regenerate", "Answer this again", () => session.regenerate(answered.turnId)),
    );
    answered.node.append(controls);
  }
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
}

// Decisions taken on cards of the current round, sent together once every card has one (the server takes one
// answer for every open approval of a round). Cards are kept across renders so that edits in them survive.
const decided = new Map<string, ApprovalDecision>();
const cards = new Map<string, HTMLElement>();

function renderPending(session: ChatSession): void {
  const open = new Set(session.state.approvals.map((a) => a.toolCallId));
  for (const id of [...cards.keys()]) {
    if (!open.has(id)) {
      cards.delete(id);
      decided.delete(id);
    }
  }
  const nodes = session.state.approvals.map((request) => {
    const card = cards.get(request.toolCallId) ?? approvalCard(session, request);
    cards.set(request.toolCallId, card);
    return card;
  });
  $("pending").replaceChildren(...nodes);
}

function approvalCard(session: ChatSession, request: PendingApproval): HTMLElement {
  const card = el("div", "approval-card");
  card.dataset.toolCallId = request.toolCallId;
  card.append(el("div", "approval-title", `Run ${request.name}? The agent waits for your decision.`));
  card.append(el("div", "approval-help", "Approve runs the arguments below as they are when you click (edit them to change the call)."));
  const args = el("textarea", "approval-args") as HTMLTextAreaElement;
  args.rows = 3;
  args.spellcheck = false;
  args.value = JSON.stringify(request.arguments, null, 2);
  args.setAttribute("aria-label", `Arguments of ${request.name} (JSON)`);
  const problem = el("div", "approval-error");
  problem.hidden = true;
  const reason = el("input", "approval-reason") as HTMLInputElement;
  reason.placeholder = "Reason for a reject (the agent reads it)";
  args.title = "Edit the arguments to run the call with others: Approve checks them before sending.";
  const note = el("div", "approval-note");
  const buttons = el("div", "approval-buttons");
  const original = JSON.stringify(request.arguments);
  const say = (text: string | null): void => {
    problem.textContent = text ?? "";
    problem.hidden = text === null;
  };
  const choose = (decision: ApprovalDecision): void => {
    decided.set(request.toolCallId, decision);
    const waiting = session.state.approvals.filter((a) => !decided.has(a.toolCallId));
    for (const button of buttons.querySelectorAll("button")) button.disabled = true;
    note.textContent = waiting.length ? `Decided: ${decision.decision}; waiting for the other card(s) of this round.` : "Sending…";
    if (waiting.length) return;
    const all = session.state.approvals.map((a) => decided.get(a.toolCallId) as ApprovalDecision);
    session.decide(all).catch((error: unknown) => {
      // Refused (e.g. 422: the tool's own schema check): nothing was taken; the cards can be answered again.
      for (const id of all.map((d) => d.tool_call_id)) decided.delete(id);
      for (const c of cards.values()) {
        for (const button of c.querySelectorAll("button")) button.disabled = false;
        (c.querySelector(".approval-note") as HTMLElement).textContent = "";
      }
      say(describeError(error));
    });
  };
  const button = (label: string, className: string, run: () => void): void => {
    const b = el("button", className, label) as HTMLButtonElement;
    b.type = "button";
    b.onclick = run;
    buttons.append(b);
  };
  button("Approve", "approve", () => {
    // Edited text in the box: approving means running what the box says, so it is checked and sent as an edit.
    let parsed: unknown;
    try {
      parsed = JSON.parse(args.value);
    } catch {
      parsed = undefined;
    }
    if (parsed !== undefined && JSON.stringify(parsed) === original) {
      say(null);
      choose({ tool_call_id: request.toolCallId, decision: "approve" });
      return;
    }
    const checked = checkArguments(args.value, toolSchemas.get(request.name));
    if (!checked.ok) {
      say(checked.error);
      return;
    }
    say(null);
    choose({ tool_call_id: request.toolCallId, decision: "edit", arguments: checked.value });
  });
  button("Reject", "reject", () => {
    say(null);
    const why = reason.value.trim();
    choose({ tool_call_id: request.toolCallId, decision: "reject", ...(why ? { reason: why } : {}) });
  });
  card.append(args, problem, reason, buttons, note);
  return card;
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
  // Until the session could be read (e.g. a refused key) its id is all the page knows of it.
  $("session-title").textContent = chat.session ? (sessionName(chat.session.title, state) ?? "New session") : chat.sessionId;
  renderMessages(state);
  renderPending(chat);
  renderConnection(chat.connection);
  const usage = usageHeader(state);
  const context = $("context");
  context.textContent = usage?.context ?? "";
  context.className = usage?.level ?? "";
  $("session-tokens").textContent = usage?.session ?? "";
  // The model was last sent a summary of the oldest turns (the history below still has every message).
  const compaction = state.compaction;
  const marker = $("compaction");
  marker.hidden = !compaction || compaction.summarized_turn_ids.length === 0;
  marker.title = compaction
    ? `${compaction.summarized_turn_ids.length} turn(s) summarised, ${compaction.elided_tool_call_ids.length} tool result(s) elided for the model: ${compaction.tokens_before} → ${compaction.tokens_after} tokens`
    : "";
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
  follow();
}

/** What a person recognises a session by: its title, else its first message (first line, cut). */
function sessionName(title: string | null | undefined, state?: ChatState): string | null {
  if (title) return title;
  const first = state?.items.find((item) => item.kind === "user");
  return first && first.kind === "user" ? firstLine(first.content) : null;
}

function firstLine(text: string): string {
  const line = text.trim().split("\n", 1)[0] ?? "";
  return line.length > 80 ? `${line.slice(0, 79)}…` : line;
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
  $("empty").hidden = true;
  following = true;
  setMenu(false);
  $("session-title").textContent = "…";
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
  // The demo client tool: sessions this page creates declare it; the page answers its requests itself.
  session.registerClientTool(BROWSER_TIME.name, BROWSER_TIME, browserTime);
  chat = session;
  try {
    await session.open();
  } catch (error) {
    showError(error);
  }
}

// The first message of each untitled session, read once (it never changes once it exists).
const firstMessages = new Map<string, string>();

function when(iso: string): string {
  const date = new Date(iso);
  const today = date.toDateString() === new Date().toDateString();
  const clock = { hour: "2-digit", minute: "2-digit", hourCycle: "h23" } as const;
  return today ? date.toLocaleTimeString([], clock) : date.toLocaleString([], { month: "short", day: "numeric", ...clock });
}

async function firstMessage(sessionId: string): Promise<string | null> {
  const known = firstMessages.get(sessionId);
  if (known !== undefined) return known;
  const page = await client.historyPage(sessionId, null, 10);
  const row = page.chat_messages.find((r) => r.type === "text" && r.role === "user");
  if (!row || typeof row.content !== "string") return null;
  firstMessages.set(sessionId, firstLine(row.content));
  return firstMessages.get(sessionId) ?? null;
}

async function loadSessions(): Promise<void> {
  const page = await client.listSessions(50);
  const list = $("sessions");
  list.replaceChildren(
    ...page.sessions.map((s) => {
      const li = el("li");
      li.dataset.id = s.id;
      const mine = s.id === chat?.sessionId ? chat.state : undefined;
      const name = el("span", "session-name", sessionName(s.title, mine) ?? firstMessages.get(s.id) ?? "New session");
      li.title = s.id;
      li.append(name, el("small", "", `${when(s.updated_at)} · ${s.model}`));
      li.classList.toggle("active", s.id === chat?.sessionId);
      li.onclick = () => {
        setMenu(false);
        location.hash = s.id;
      };
      if (!s.title && !mine?.items.some((item) => item.kind === "user")) {
        firstMessage(s.id)
          .then((text) => text && (name.textContent = text))
          .catch(() => undefined); // a name is a nicety: the session still opens
      }
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

async function loadToolSchemas(): Promise<void> {
  const catalog = await client.tools();
  toolSchemas = new Map(catalog.tools.map((t) => [t.name, t.parameters]));
}

async function start(): Promise<void> {
  showError(null);
  try {
    await Promise.all([loadModels(), loadSessions()]);
    // Only for checking edits on the page: the server checks them again, so a failure here is no error.
    loadToolSchemas().catch(() => undefined);
  } catch (error) {
    showError(error);
    return;
  }
  const sessionId = location.hash.slice(1);
  if (sessionId) await openSession(sessionId);
}

function wireLayout(): void {
  $("menu").onclick = () => setMenu(!document.body.classList.contains("menu-open"));
  $("close-menu").onclick = () => setMenu(false);
  $("backdrop").onclick = () => setMenu(false);
  document.addEventListener("keydown", (event) => event.key === "Escape" && setMenu(false));
  const box = $("messages");
  box.addEventListener("scroll", () => {
    following = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  });
  new ResizeObserver(follow).observe(box);
}

// Files for the next message: chosen with the button, pasted or dropped; each uploaded at once
// (POST /v1/files) and shown as a chip until the message is sent.
function wireAttachments(): { take: () => { file_id: string }[]; uploading: () => boolean } {
  const list = $("pending-files");
  const picker = $<HTMLInputElement>("file-input");
  // In the order they were added; file_id once uploaded.
  let entries: { file_id: string | null; chip: HTMLElement }[] = [];
  const add = async (file: File): Promise<void> => {
    const name = file.name || "pasted image";
    const chip = el("span", "attachment-chip uploading");
    const label = el("span", "label", `${name} (uploading…)`);
    // How much of the upload has left, from XMLHttpRequest's progress events (fetch has none).
    const bar = el("progress", "upload-progress") as HTMLProgressElement;
    bar.max = 1;
    bar.value = 0;
    chip.dataset.progress = "0";
    chip.append(label, bar);
    const entry: { file_id: string | null; chip: HTMLElement } = { file_id: null, chip };
    entries.push(entry);
    list.append(chip);
    const onProgress = (sent: number, total: number): void => {
      const done = total > 0 ? sent / total : 0;
      bar.value = done;
      chip.dataset.progress = done.toFixed(3);
      label.textContent = `${name} (uploading… ${Math.floor(done * 100)}%)`;
    };
    try {
      const stored = await client.uploadFile(file, file.name || "pasted.png", { onProgress });
      chip.textContent = stored.name;
      chip.classList.remove("uploading");
      delete chip.dataset.progress;
      chip.dataset.fileId = stored.id;
      const remove = el("button", "remove", "×") as HTMLButtonElement;
      remove.type = "button";
      remove.title = "Remove";
      remove.onclick = () => {
        entries = entries.filter((other) => other !== entry);
        chip.remove();
      };
      chip.append(remove);
      entry.file_id = stored.id;
    } catch (error) {
      entries = entries.filter((other) => other !== entry);
      chip.remove();
      showError(error);
    }
  };
  const addAll = (files: FileList | null | undefined): void => {
    for (const file of Array.from(files ?? [])) void add(file);
  };
  $("attach").onclick = () => picker.click();
  picker.onchange = () => {
    addAll(picker.files);
    picker.value = "";
  };
  $("input").addEventListener("paste", (event) => {
    if (event.clipboardData?.files.length) {
      event.preventDefault();
      addAll(event.clipboardData.files);
    }
  });
  const composer = $("composer");
  composer.addEventListener("dragover", (event) => event.preventDefault());
  composer.addEventListener("drop", (event) => {
    event.preventDefault();
    addAll(event.dataTransfer?.files);
  });
  return {
    take: () => {
      const taken = entries.flatMap(({ file_id }) => (file_id ? [{ file_id }] : []));
      for (const entry of entries) entry.chip.remove();
      entries = [];
      return taken;
    },
    uploading: () => entries.some((entry) => entry.file_id === null),
  };
}

function wire(): void {
  const key = $<HTMLInputElement>("key");
  key.value = sessionStorage.getItem(KEY_STORAGE) ?? "";
  key.onchange = () => {
    // The browser fires change again when the field loses focus after a scripted or pasted value: the same
    // key must not close the open session (a message sent at that moment found no session and was dropped).
    if (key.value.trim() === (sessionStorage.getItem(KEY_STORAGE) ?? "")) return;
    sessionStorage.setItem(KEY_STORAGE, key.value.trim());
    client = makeClient();
    chat?.close();
    chat = null;
    void start();
  };
  $("new-session").onclick = async () => {
    try {
      const session = await client.createSession({
        model: $<HTMLSelectElement>("model").value || null,
        client_tools: [BROWSER_TIME],
        // Every server tool of the session waits for a decision on an approval card.
        ...($<HTMLInputElement>("ask-approval").checked ? { approval: ["*"] } : {}),
      });
      await loadSessions();
      setMenu(false);
      location.hash = session.id;
    } catch (error) {
      showError(error);
    }
  };
  const input = $<HTMLTextAreaElement>("input");
  const pending = wireAttachments();
  const send = async (): Promise<void> => {
    const text = input.value.trim();
    if (!text) return;
    if (!chat) {
      showError(new Error("Open a session on the left (or create one) to send a message."));
      return;
    }
    if (pending.uploading()) {
      showError(new Error("Wait for the files to finish uploading."));
      return;
    }
    const attachments = pending.take();
    input.value = "";
    try {
      await chat.send(text, attachments.length ? { attachments } : {});
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
wireLayout();
void start();
