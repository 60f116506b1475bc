import { describe, expect, it } from "vitest";
import {
  contextLevel,
  formatDuration,
  formatTokens,
  messageMeta,
  startsRun,
  statusLine,
  usageHeader,
  workedFor,
} from "../src/format";
import { emptyState, type ChatItem } from "../src/reduce";

const at = "2026-02-28T14:30:05.000+00:00";

describe("the seed's display rules", () => {
  it("durations: 328ms, 1.2s, 1m 23s", () => {
    expect([328, 999, 1000, 1249, 59_999, 60_000, 83_400].map(formatDuration)).toEqual([
      "328ms", "999ms", "1.0s", "1.2s", "59.9s", "1m 0s", "1m 23s",
    ]);
  });

  it("meta: time; ✻ from 10 s of text; duration of a finished tool; none for turn markers", () => {
    const text = (durationMs: number | null): ChatItem => ({
      kind: "assistant", id: "m", content: "", timestamp: at, model: "m", durationMs, interrupted: false, streaming: false,
    });
    expect(messageMeta(text(9_999), "UTC")).toBe("14:30");
    expect(messageMeta(text(35_000), "UTC")).toBe("✻ 35.0s · 14:30");
    expect(messageMeta(text(null), "UTC")).toBe("14:30");
    const tool: ChatItem = {
      kind: "tool_group", id: "t", toolCallId: "c", toolName: "x", arguments: {}, result: "r", isError: false,
      timestamp: at, model: "m", durationMs: 328, interrupted: false, decision: null, reason: null,
    };
    expect(messageMeta(tool, "UTC")).toBe("328ms · 14:30");
    expect(messageMeta({ ...tool, durationMs: null }, "UTC")).toBe("14:30");
    expect(messageMeta({ kind: "turn_start", id: "s", turnId: "t", timestamp: at }, "UTC")).toBeNull();
  });

  it("worked for: only from a minute", () => {
    expect(workedFor(59.9)).toBeNull();
    expect(workedFor(90)).toBe("Worked for 1 minute 30 seconds");
    expect(workedFor(120)).toBe("Worked for 2 minutes");
    expect(workedFor(3661)).toBe("Worked for 1 hour 1 minute 1 second");
  });

  it("context header: percent colored green < 50, yellow to 80, red above; tokens when the window is unknown", () => {
    expect([0, 49.9, 50, 80, 80.1].map(contextLevel)).toEqual(["ok", "ok", "warn", "warn", "high"]);
    const usage = { context_used: 15_234, context_window: 200_000, context_percent: 7.6, session_total_tokens: 28_500, model: "m", estimated: false, cache_read_tokens: 0, cache_write_tokens: 0 };
    expect(usageHeader({ ...emptyState(), usage })).toEqual({ context: "Context: 7.6%", session: "Session: 28.5K tokens", level: "ok" });
    expect(usageHeader({ ...emptyState(), usage: { ...usage, context_window: null, context_percent: null } })).toEqual({
      context: "Context: 15.2K tokens", session: "Session: 28.5K tokens", level: null,
    });
    expect(formatTokens(950)).toBe("950");
  });

  it("status line: hidden when idle", () => {
    expect(statusLine(emptyState())).toBeNull();
    expect(statusLine({ ...emptyState(), status: "thinking" })).toBe("thinking…");
    expect(statusLine({ ...emptyState(), status: "tool_calling", toolName: "current_time" })).toBe("calling current_time…");
  });

  it("arrows: only the first bubble of a run of one role", () => {
    const items: ChatItem[] = [
      { kind: "turn_start", id: "a", turnId: "t", timestamp: at },
      { kind: "user", id: "b", content: "", timestamp: at, sender: "U", clientMessageId: null, turnId: "t", attachments: [] },
      { kind: "assistant", id: "c", content: "", timestamp: at, model: null, durationMs: null, interrupted: false, streaming: false },
      { kind: "tool_group", id: "d", toolCallId: "x", toolName: "n", arguments: {}, result: null, isError: null, timestamp: at, model: null, durationMs: null, interrupted: false, decision: null, reason: null },
      { kind: "assistant", id: "e", content: "", timestamp: at, model: null, durationMs: null, interrupted: false, streaming: false },
    ];
    expect(items.map((_, i) => startsRun(items, i))).toEqual([false, true, true, false, false]);
  });
});
