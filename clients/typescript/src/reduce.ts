// A pure reducer: history rows plus events in, what a chat page renders out (docs/events.md: every event
// carries the ids, times and model the page shows, so nothing is back-filled or guessed here).
import type {
  AgentStatus,
  ContextCompactedEvent,
  Attachment,
  HistoryRow,
  ParleyEvent,
  PendingRequest,
  QueuedItem,
  TokenUsageEvent,
  Turn,
} from "./types";

export interface TurnStartItem {
  kind: "turn_start";
  id: string;
  turnId: string;
  timestamp: string;
}
export interface UserTextItem {
  kind: "user";
  id: string;
  content: string;
  timestamp: string;
  sender: string;
  clientMessageId: string | null;
  turnId: string | null;
  /** The message's files (metadata only: the bytes are at /v1/files/{file_id}/content). */
  attachments: Attachment[];
}
export interface AssistantTextItem {
  kind: "assistant";
  id: string;
  content: string;
  timestamp: string;
  model: string | null;
  durationMs: number | null;
  interrupted: boolean;
  /** Still streaming: no response_done yet. */
  streaming: boolean;
}
/** The reasoning a model streamed before its answer (docs/events.md, reasoning_delta): shown collapsed. */
export interface ReasoningItem {
  kind: "reasoning";
  id: string;
  content: string;
  timestamp: string;
  model: string | null;
  /** From the model request to the reasoning's end: known from the history, null while live. */
  durationMs: number | null;
  interrupted: boolean;
  /** Still streaming: its response has not ended yet. */
  streaming: boolean;
}
export interface ToolGroupItem {
  kind: "tool_group";
  id: string;
  toolCallId: string;
  toolName: string;
  arguments: unknown;
  result: string | null;
  isError: boolean | null;
  timestamp: string;
  model: string | null;
  durationMs: number | null;
  interrupted: boolean;
  /** A person's decision when the call waited for approval (approve, edit, reject, expired, interrupted). */
  decision: string | null;
  /** The reason given with a reject. */
  reason: string | null;
}
export interface TurnDoneItem {
  kind: "turn_done";
  id: string;
  turnId: string;
  timestamp: string;
  durationSeconds: number;
  status: string;
}
export interface ErrorItem {
  kind: "error";
  id: string;
  content: string;
  code: string;
  model: string | null;
  timestamp: string;
}
export type ChatItem =
  | TurnStartItem
  | UserTextItem
  | AssistantTextItem
  | ReasoningItem
  | ToolGroupItem
  | TurnDoneItem
  | ErrorItem;

/** A streaming assistant text or reasoning, ended (a response, a turn or a history read without a running turn). */
function ended(item: ChatItem): ChatItem {
  return (item.kind === "assistant" || item.kind === "reasoning") && item.streaming ? { ...item, streaming: false } : item;
}

/** A message this tab sent that no event has confirmed yet (optimistic rendering). */
export interface OptimisticItem {
  clientMessageId: string;
  content: string;
  timestamp: string;
  /** The POST failed: the page shows it with the error and may offer to retry. */
  error: string | null;
}

export interface PendingApproval {
  toolCallId: string;
  name: string;
  arguments: unknown;
  expiresAt: string | null;
  decisions: string[];
}
export interface PendingClientTool {
  toolCallId: string;
  name: string;
  arguments: unknown;
  expiresAt: string | null;
}

/** Where a turn sits in the session's tree: what a "< i/n >" control needs (docs/protocol.md, Branches). */
export interface TurnBranch {
  parentTurnId: string | null;
  /** The turns with the same parent, this one included, oldest first. */
  siblings: string[];
  /** This turn's place in `siblings`, from 0. */
  index: number;
}

export interface ChatState {
  items: ChatItem[];
  optimistic: OptimisticItem[];
  queue: QueuedItem[];
  status: AgentStatus;
  toolName: string | null;
  runningTurnId: string | null;
  usage: Omit<TokenUsageEvent, "type" | "seq" | "session_id"> | null;
  /** What the last compacted model call sent instead of the whole history (docs/context.md): the page's
   * "earlier messages summarised" marker. The history itself is unchanged. */
  compaction: Omit<ContextCompactedEvent, "type" | "seq" | "session_id"> | null;
  currentModel: string | null;
  approvals: PendingApproval[];
  clientTools: PendingClientTool[];
  lastSeq: number;
  /** Times the history was reloaded because the stream could not be replayed (resync). */
  resyncs: number;
  /** The turns of the active path by id, with their siblings (from GET .../turns: fromTurns). */
  branches: Record<string, TurnBranch>;
  /** The active path's last turn, once a branch_changed said (null: the latest turn). */
  headTurnId: string | null;
  /** Times the active path changed (branch_changed): the history must be read again. */
  branchChanges: number;
}

export function emptyState(): ChatState {
  return {
    items: [],
    optimistic: [],
    queue: [],
    status: "idle",
    toolName: null,
    runningTurnId: null,
    usage: null,
    compaction: null,
    currentModel: null,
    approvals: [],
    clientTools: [],
    lastSeq: 0,
    resyncs: 0,
    branches: {},
    headTurnId: null,
    branchChanges: 0,
  };
}

/** One history row (GET .../messages) as an item (docs/protocol.md: mapped directly, ids kept). */
export function itemFromRow(row: HistoryRow): ChatItem {
  switch (row.type) {
    case "turn_start":
      return { kind: "turn_start", id: row.id, turnId: row.turn_id, timestamp: row.timestamp };
    case "text":
      if (row.role === "user") {
        return {
          kind: "user",
          id: row.id,
          content: row.content,
          timestamp: row.timestamp,
          sender: row.sender,
          clientMessageId: row.client_message_id ?? null,
          turnId: null,
          attachments: row.attachments ?? [],
        };
      }
      return {
        kind: "assistant",
        id: row.id,
        content: row.content,
        timestamp: row.timestamp,
        model: row.model,
        durationMs: row.duration_ms,
        interrupted: row.interrupted,
        streaming: row.duration_ms === null && !row.interrupted,
      };
    case "reasoning":
      return {
        kind: "reasoning",
        id: row.id,
        content: row.content,
        timestamp: row.timestamp,
        model: row.model,
        durationMs: row.duration_ms,
        interrupted: row.interrupted,
        streaming: row.duration_ms === null && !row.interrupted,
      };
    case "tool_group":
      return {
        kind: "tool_group",
        id: row.id,
        toolCallId: row.tool_call_id,
        toolName: row.tool_name,
        arguments: row.arguments,
        result: row.result,
        isError: row.is_error,
        timestamp: row.timestamp,
        model: row.model,
        durationMs: row.duration_ms,
        interrupted: row.interrupted,
        decision: row.decision ?? null,
        reason: null,
      };
    case "turn_done":
      return {
        kind: "turn_done",
        id: row.id,
        turnId: row.turn_id,
        timestamp: row.timestamp,
        durationSeconds: row.duration_seconds,
        status: row.status,
      };
    case "error":
      return { kind: "error", id: row.id, content: row.content, code: row.code, model: row.model, timestamp: row.timestamp };
  }
}

/** The state a history read describes; the stream then goes on after `lastEventId`. Keeps what the
 * history cannot know: this tab's unconfirmed messages, the usage and the pending requests. */
export function fromHistory(rows: HistoryRow[], lastEventId: number, previous: ChatState = emptyState()): ChatState {
  let items = rows.map(itemFromRow);
  const confirmed = new Set(items.flatMap((i) => (i.kind === "user" && i.clientMessageId ? [i.clientMessageId] : [])));
  let runningTurnId: string | null = null;
  for (const item of items) {
    if (item.kind === "turn_start") runningTurnId = item.turnId;
    if (item.kind === "turn_done" && item.turnId === runningTurnId) runningTurnId = null;
  }
  if (runningTurnId === null) {
    items = items.map(ended);
  }
  const lastModel = [...items].reverse().find((i) => i.kind === "assistant" || i.kind === "tool_group");
  return {
    ...previous,
    items,
    optimistic: previous.optimistic.filter((o) => !confirmed.has(o.clientMessageId)),
    runningTurnId,
    status: runningTurnId === null ? "idle" : previous.status === "idle" ? "thinking" : previous.status,
    currentModel: (lastModel && "model" in lastModel ? lastModel.model : null) ?? previous.currentModel,
    lastSeq: lastEventId,
  };
}

/** The turn view's tree fields (GET .../turns): each turn's parent, siblings and index. */
export function fromTurns(state: ChatState, turns: Turn[]): ChatState {
  const branches: Record<string, TurnBranch> = {};
  for (const turn of turns) {
    branches[turn.turn_id] = { parentTurnId: turn.parent_turn_id, siblings: turn.siblings, index: turn.sibling_index };
  }
  return { ...state, branches };
}

/** The sibling before (-1) or after (+1) a turn, to activate for a "< i/n >" arrow; null at either end. */
export function siblingTurn(state: ChatState, turnId: string, step: -1 | 1): string | null {
  const branch = state.branches[turnId];
  if (!branch) return null;
  return branch.siblings[branch.index + step] ?? null;
}

/** The pending requests as GET .../pending lists them (a page that reloads, or a resync): the approvals and
 * client tool requests that still wait, replacing what the state had (answered ones are gone). */
export function fromPending(state: ChatState, pending: PendingRequest[]): ChatState {
  const approvals: PendingApproval[] = pending
    .filter((p) => p.kind === "approval")
    .map((p) => ({
      toolCallId: p.tool_call_id,
      name: p.name,
      arguments: p.arguments,
      expiresAt: p.expires_at,
      decisions: p.decisions ?? ["approve", "reject", "edit"],
    }));
  const clientTools: PendingClientTool[] = pending
    .filter((p) => p.kind === "client_tool")
    .map((p) => ({ toolCallId: p.tool_call_id, name: p.name, arguments: p.arguments, expiresAt: p.expires_at }));
  const waiting = approvals.length + clientTools.length > 0 && state.runningTurnId !== null;
  return { ...state, approvals, clientTools, status: waiting ? "awaiting_input" : state.status };
}

/** A text or reasoning delta: appended to its streaming item, or the item's first piece (which carries the
 * message's timestamp and model). */
function appendDelta(
  s: ChatState,
  event: { id: string; text: string; timestamp?: string | null; model?: string | null },
  kind: "assistant" | "reasoning",
): ChatState {
  const existing = s.items.find((i) => i.id === event.id);
  if (existing && existing.kind === kind) {
    return {
      ...s,
      items: replaceItem<AssistantTextItem | ReasoningItem>(s.items, event.id, (i) => ({ ...i, content: i.content + event.text })),
    };
  }
  const item: AssistantTextItem | ReasoningItem = {
    kind,
    id: event.id,
    content: event.text,
    timestamp: event.timestamp ?? new Date().toISOString(),
    model: event.model ?? s.currentModel,
    durationMs: null,
    interrupted: false,
    streaming: true,
  };
  return { ...s, currentModel: event.model ?? s.currentModel, items: [...s.items, item] };
}

function replaceItem<T extends ChatItem>(items: ChatItem[], id: string, update: (item: T) => T): ChatItem[] {
  const index = items.findIndex((i) => i.id === id);
  if (index < 0) return items;
  const next = items.slice();
  next[index] = update(items[index] as T);
  return next;
}

function upsert(items: ChatItem[], item: ChatItem): ChatItem[] {
  const index = items.findIndex((i) => i.id === item.id);
  if (index < 0) return [...items, item];
  const next = items.slice();
  next[index] = item;
  return next;
}

/** The next state after one event; the input is never changed. */
export function reduce(state: ChatState, event: ParleyEvent): ChatState {
  const s: ChatState = { ...state, lastSeq: Math.max(state.lastSeq, event.type === "resync" ? event.last_event_id : event.seq) };
  switch (event.type) {
    case "turn_start":
      return {
        ...s,
        runningTurnId: event.turn_id,
        status: s.status === "idle" ? "thinking" : s.status,
        items: upsert(s.items, { kind: "turn_start", id: event.id, turnId: event.turn_id, timestamp: event.timestamp }),
      };
    case "user_message": {
      const optimistic = event.client_message_id
        ? s.optimistic.filter((o) => o.clientMessageId !== event.client_message_id)
        : s.optimistic;
      const currentModel = event.model ?? s.currentModel;
      if (event.turn_id === null) return { ...s, optimistic, currentModel }; // waiting: shown from the queue
      const item: UserTextItem = {
        kind: "user",
        id: event.id,
        content: event.text,
        timestamp: event.timestamp,
        sender: event.sender,
        clientMessageId: event.client_message_id ?? null,
        turnId: event.turn_id,
        attachments: event.attachments ?? [],
      };
      return { ...s, optimistic, currentModel, items: upsert(s.items, item) };
    }
    case "text_delta":
      return appendDelta(s, event, "assistant");
    case "reasoning_delta":
      return appendDelta(s, event, "reasoning");
    case "response_done": {
      // The response's reasoning (it has its own id) ends with it.
      const items = s.items.map((i) => (i.kind === "reasoning" ? ended(i) : i));
      if (event.id === null) return { ...s, items, currentModel: event.response.model };
      return {
        ...s,
        currentModel: event.response.model,
        items: replaceItem<AssistantTextItem>(items, event.id, (i) => ({ ...i, durationMs: event.duration_ms, streaming: false })),
      };
    }
    case "tool_exec_start":
      return {
        ...s,
        items: upsert(s.items, {
          kind: "tool_group",
          id: event.id,
          toolCallId: event.tool_call.id,
          toolName: event.tool_call.name,
          arguments: event.tool_call.arguments,
          result: null,
          isError: null,
          timestamp: event.timestamp,
          model: event.model,
          durationMs: null,
          interrupted: false,
          decision: null,
          reason: null,
        }),
      };
    case "tool_exec_end":
      return {
        ...s,
        items: replaceItem<ToolGroupItem>(s.items, event.id, (i) => ({
          ...i,
          result: event.tool_result.content,
          isError: event.tool_result.is_error,
          durationMs: event.duration_ms,
        })),
      };
    case "agent_status":
      return { ...s, status: event.status, toolName: event.status === "tool_calling" ? event.tool_name : null };
    case "token_usage": {
      const { type: _t, seq: _s, session_id: _id, ...usage } = event;
      return { ...s, usage, currentModel: event.model };
    }
    case "context_compacted": {
      const { type: _t, seq: _s, session_id: _id, ...compaction } = event;
      return { ...s, compaction };
    }
    case "queue_updated":
      return {
        ...s,
        queue: event.queue,
        optimistic: s.optimistic.filter((o) => !event.queue.some((q) => q.client_message_id === o.clientMessageId)),
      };
    case "agent_cancelled": {
      const cut = new Set([...event.interrupted_message_ids, ...event.interrupted_tool_call_ids]);
      return {
        ...s,
        status: "idle",
        toolName: null,
        approvals: [],
        clientTools: [],
        items: s.items.map((i) => {
          if ((i.kind === "assistant" || i.kind === "reasoning") && cut.has(i.id)) return { ...i, interrupted: true, streaming: false };
          if (i.kind === "reasoning" && i.streaming) return { ...i, streaming: false };
          if (i.kind === "tool_group" && (cut.has(i.id) || cut.has(i.toolCallId))) return { ...i, interrupted: true };
          return i;
        }),
      };
    }
    case "error":
      return {
        ...s,
        items: upsert(s.items, {
          kind: "error",
          id: event.id,
          content: event.message,
          code: event.code,
          model: event.model,
          timestamp: event.timestamp,
        }),
      };
    case "turn_done":
      return {
        ...s,
        runningTurnId: s.runningTurnId === event.turn_id ? null : s.runningTurnId,
        status: "idle",
        toolName: null,
        items: upsert(
          s.items.map(ended),
          {
            kind: "turn_done",
            id: event.id,
            turnId: event.turn_id,
            timestamp: event.timestamp,
            durationSeconds: event.duration_seconds,
            status: event.status,
          },
        ),
      };
    case "approval_requested":
      return {
        ...s,
        status: "awaiting_input",
        approvals: [
          ...s.approvals.filter((a) => a.toolCallId !== event.tool_call_id),
          {
            toolCallId: event.tool_call_id,
            name: event.name,
            arguments: event.arguments,
            expiresAt: event.expires_at,
            decisions: event.decisions ?? ["approve", "reject", "edit"],
          },
        ],
      };
    case "approval_resolved":
      return {
        ...s,
        approvals: s.approvals.filter((a) => a.toolCallId !== event.tool_call_id),
        // The tool group shows the decision, and after an edit the arguments the call runs with.
        items: replaceItem<ToolGroupItem>(s.items, event.id, (i) => ({
          ...i,
          arguments: event.arguments,
          decision: event.decision,
          reason: event.reason ?? null,
        })),
      };
    case "client_tool_requested":
      return {
        ...s,
        status: "awaiting_input",
        clientTools: [
          ...s.clientTools.filter((c) => c.toolCallId !== event.tool_call_id),
          { toolCallId: event.tool_call_id, name: event.name, arguments: event.arguments, expiresAt: event.expires_at },
        ],
      };
    case "client_tool_resolved":
      return { ...s, clientTools: s.clientTools.filter((c) => c.toolCallId !== event.tool_call_id) };
    case "resync":
      return { ...s, resyncs: s.resyncs + 1 };
    case "branch_changed": {
      // The items of the old path are kept until the history is read again (ChatSession reloads on it).
      const onPath = new Set(event.path_turn_ids);
      const branches = Object.fromEntries(Object.entries(s.branches).filter(([turnId]) => onPath.has(turnId)));
      return { ...s, headTurnId: event.head_turn_id, branchChanges: s.branchChanges + 1, branches };
    }
  }
}

/** This tab's message, shown at once; the event that confirms it (same client_message_id) replaces it. */
export function addOptimistic(state: ChatState, item: OptimisticItem): ChatState {
  return { ...state, optimistic: [...state.optimistic, item] };
}

export function failOptimistic(state: ChatState, clientMessageId: string, error: string): ChatState {
  return {
    ...state,
    optimistic: state.optimistic.map((o) => (o.clientMessageId === clientMessageId ? { ...o, error } : o)),
  };
}

/** The text a page shows for a conversation: user and assistant texts, in order (tests compare it). */
export function transcript(state: ChatState): string[] {
  return state.items.flatMap((i) => (i.kind === "user" || i.kind === "assistant" ? [`${i.kind}: ${i.content}`] : []));
}
