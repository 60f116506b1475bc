// The display rules of docs/frontend.md (The page), as pure functions a page calls.
import type { ChatItem, ChatState } from "./reduce";

/** 328ms, 1.2s, 1m 23s. */
export function formatDuration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  if (ms < 60_000) return `${(Math.floor(ms / 100) / 10).toFixed(1)}s`;
  const seconds = Math.floor(ms / 1000);
  return `${Math.floor(seconds / 60)}m ${seconds % 60}s`;
}

/** 14:30, in the reader's local time. */
export function formatClock(timestamp: string, timeZone?: string): string {
  return new Date(timestamp).toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit", hour12: false, ...(timeZone ? { timeZone } : {}) });
}

/** The meta right of a message: time; `✻ 35s · 14:30` for text of 10 s or more; `328ms · 14:30` for a
 * finished tool group; nothing for turn markers. */
export function messageMeta(item: ChatItem, timeZone?: string): string | null {
  switch (item.kind) {
    case "turn_start":
    case "turn_done":
      return null;
    case "assistant":
      return item.durationMs !== null && item.durationMs >= 10_000
        ? `✻ ${formatDuration(item.durationMs)} · ${formatClock(item.timestamp, timeZone)}`
        : formatClock(item.timestamp, timeZone);
    case "tool_group":
      return item.durationMs !== null
        ? `${formatDuration(item.durationMs)} · ${formatClock(item.timestamp, timeZone)}`
        : formatClock(item.timestamp, timeZone);
    default:
      return formatClock(item.timestamp, timeZone);
  }
}

function plural(n: number, unit: string): string {
  return `${n} ${unit}${n === 1 ? "" : "s"}`;
}

/** `Worked for 1 minute 30 seconds` under a turn of a minute or more; null below (not shown). */
export function workedFor(durationSeconds: number): string | null {
  if (durationSeconds < 60) return null;
  const total = Math.floor(durationSeconds);
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const seconds = total % 60;
  const parts = [hours ? plural(hours, "hour") : "", minutes ? plural(minutes, "minute") : "", seconds ? plural(seconds, "second") : ""];
  return `Worked for ${parts.filter(Boolean).join(" ")}`;
}

/** 950, 15.2K, 1.3M tokens. */
export function formatTokens(n: number): string {
  if (n < 1000) return String(n);
  if (n < 1_000_000) return `${(n / 1000).toFixed(1)}K`;
  return `${(n / 1_000_000).toFixed(1)}M`;
}

export type ContextLevel = "ok" | "warn" | "high";

/** Green under 50 %, yellow to 80 %, red above (docs/frontend.md). */
export function contextLevel(percent: number): ContextLevel {
  return percent < 50 ? "ok" : percent <= 80 ? "warn" : "high";
}

/** `Context: 7.6% | Session: 28.5K tokens`, or `Context: 15.2K tokens | ...` when the window is unknown. */
export function usageHeader(state: ChatState): { context: string; session: string; level: ContextLevel | null } | null {
  const usage = state.usage;
  if (!usage) return null;
  const session = `Session: ${formatTokens(usage.session_total_tokens)} tokens`;
  if (usage.context_percent === null) {
    return { context: `Context: ${formatTokens(usage.context_used)} tokens`, session, level: null };
  }
  return { context: `Context: ${usage.context_percent.toFixed(1)}%`, session, level: contextLevel(usage.context_percent) };
}

/** The status line under the messages: hidden when idle (docs/frontend.md). */
export function statusLine(state: ChatState): string | null {
  switch (state.status) {
    case "idle":
      return null;
    case "thinking":
      return "thinking…";
    case "tool_calling":
      return `calling ${state.toolName ?? "a tool"}…`;
    case "awaiting_input":
      return "waiting for your answer…";
  }
}

/** Whether an item opens a run of the same role (only those get the bubble's arrow, docs/frontend.md). */
export function startsRun(items: ChatItem[], index: number): boolean {
  const role = (i: ChatItem | undefined): string | null =>
    !i
      ? null
      : i.kind === "user"
        ? "user"
        : i.kind === "assistant" || i.kind === "reasoning" || i.kind === "tool_group" || i.kind === "error"
          ? "assistant"
          : null;
  const mine = role(items[index]);
  if (mine === null) return false;
  for (let j = index - 1; j >= 0; j--) {
    const r = role(items[j]);
    if (r !== null) return r !== mine;
    if (items[j]?.kind === "turn_done") continue;
  }
  return true;
}
