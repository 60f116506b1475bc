// The reducer's pending requests: from GET .../pending (a reload) and from the events that follow.
import { describe, expect, it } from "vitest";
import { emptyState, fromHistory, fromPending, reduce, type ChatState } from "../src/reduce";
import type { HistoryRow, ParleyEvent, PendingRequest } from "../src/types";

const AT = "2026-11-23T10:00:00+00:00";
const request = (kind: PendingRequest["kind"], id: string): PendingRequest => ({
  tool_call_id: id,
  kind,
  id: `m_${id}`,
  turn_id: "t_1",
  name: kind === "approval" ? "calculate" : "get_browser_time",
  arguments: { n: 1 },
  requested_at: AT,
  expires_at: AT,
  decisions: kind === "approval" ? ["approve", "reject"] : null,
});
const running: ChatState = { ...emptyState(), runningTurnId: "t_1", status: "thinking", lastSeq: 5 };

describe("fromPending", () => {
  it("replaces the pending requests with what waits, and says the turn waits for input", () => {
    const before = Object.freeze({ ...running, approvals: [{ toolCallId: "old", name: "x", arguments: {}, expiresAt: AT, decisions: [] }] });
    const after = fromPending(before, [request("approval", "a1"), request("client_tool", "c1")]);
    expect(after.approvals).toEqual([{ toolCallId: "a1", name: "calculate", arguments: { n: 1 }, expiresAt: AT, decisions: ["approve", "reject"] }]);
    expect(after.clientTools).toEqual([{ toolCallId: "c1", name: "get_browser_time", arguments: { n: 1 }, expiresAt: AT }]);
    expect(after.status).toBe("awaiting_input");
    expect(before.approvals.map((a) => a.toolCallId)).toEqual(["old"]); // pure: the input is unchanged
  });

  it("leaves the status alone when nothing waits, and clears what was answered meanwhile", () => {
    const after = fromPending({ ...running, clientTools: [{ toolCallId: "c0", name: "n", arguments: {}, expiresAt: AT }] }, []);
    expect([after.status, after.clientTools, after.approvals]).toEqual(["thinking", [], []]);
  });

  it("an approval_requested repeated by the stream after the reload stays one card; approval_resolved removes it", () => {
    const base = { session_id: "s_1", id: "m_a1", turn_id: "t_1", tool_call_id: "a1" };
    let state = fromPending(running, [request("approval", "a1")]);
    state = reduce(state, { ...base, seq: 6, type: "approval_requested", name: "calculate", arguments: { n: 1 }, expires_at: AT, decisions: ["approve", "reject"] } as ParleyEvent);
    expect(state.approvals).toHaveLength(1);
    state = reduce(state, { ...base, seq: 7, type: "approval_resolved", decision: "reject", arguments: { n: 1 }, reason: "no", wait_ms: 3 } as ParleyEvent);
    expect(state.approvals).toEqual([]);
  });

  it("approval_resolved puts the decision, the reason and the arguments the call runs with on its tool group", () => {
    const start = { session_id: "s_1", seq: 6, type: "tool_exec_start", id: "m_a1", timestamp: AT, model: "parley/demo", source: "builtin", tool_call: { id: "a1", name: "calculate", arguments: { expression: "2+3" } } } as ParleyEvent;
    const resolved = { session_id: "s_1", seq: 8, type: "approval_resolved", id: "m_a1", turn_id: "t_1", tool_call_id: "a1", decision: "edit", arguments: { expression: "6*7" }, reason: null, wait_ms: 900 } as ParleyEvent;
    const before = reduce(running, start);
    const after = reduce(before, resolved);
    expect(after.items).toMatchObject([{ kind: "tool_group", arguments: { expression: "6*7" }, decision: "edit", reason: null }]);
    expect(before.items).toMatchObject([{ arguments: { expression: "2+3" }, decision: null }]);
  });
});

describe("reasoning", () => {
  const delta = (seq: number, id: string, text: string, first = false) =>
    ({ session_id: "s_1", seq, type: "reasoning_delta", id, text, ...(first ? { timestamp: AT, model: "parley/demo" } : {}) }) as ParleyEvent;

  it("reasoning_delta opens a streaming reasoning item before the text, and the response's end closes it", () => {
    let state = reduce(running, delta(6, "m_r", "Let me ", true));
    state = reduce(state, delta(7, "m_r", "think."));
    state = reduce(state, { session_id: "s_1", seq: 8, type: "text_delta", id: "m_t", text: "Hi", timestamp: AT, model: "parley/demo" } as ParleyEvent);
    expect(state.items).toMatchObject([
      { kind: "reasoning", id: "m_r", content: "Let me think.", model: "parley/demo", streaming: true },
      { kind: "assistant", id: "m_t", content: "Hi", streaming: true },
    ]);
    const done = { session_id: "s_1", seq: 9, type: "response_done", id: "m_t", duration_ms: 5, first_token_ms: 1, response: { model: "parley/demo", finish_reason: "stop", usage: null } } as ParleyEvent;
    state = reduce(state, done);
    expect(state.items.map((i) => ("streaming" in i ? i.streaming : null))).toEqual([false, false]);
  });

  it("a stop marks a reasoning it cut short as interrupted", () => {
    const state = reduce(reduce(running, delta(6, "m_r", "Hmm", true)), {
      session_id: "s_1", seq: 7, type: "agent_cancelled", turn_id: "t_1", interrupted_message_ids: ["m_r"], interrupted_tool_call_ids: [],
    } as ParleyEvent);
    expect(state.items).toMatchObject([{ kind: "reasoning", interrupted: true, streaming: false }]);
  });

  it("a reasoning row of the history is an item with its duration", () => {
    const row = { id: "m_r", type: "reasoning", role: "assistant", content: "Thought.", timestamp: AT, duration_ms: 1200, model: "parley/demo", interrupted: false } as HistoryRow;
    expect(fromHistory([row], 3).items).toEqual([
      { kind: "reasoning", id: "m_r", content: "Thought.", timestamp: AT, model: "parley/demo", durationMs: 1200, interrupted: false, streaming: false },
    ]);
  });
});

describe("context_compacted", () => {
  it("keeps what the last call sent instead of the history, and leaves the items alone", () => {
    const event = {
      session_id: "s_1",
      seq: 6,
      type: "context_compacted",
      turn_id: "t_1",
      tokens_before: 9000,
      tokens_after: 2000,
      summarized_turn_ids: ["t_0"],
      elided_tool_call_ids: ["call_1"],
      elided_file_ids: ["file_1"],
      summary_id: "cs_1",
      summary_written: true,
    } as ParleyEvent;
    const after = reduce(running, event);
    expect(after.compaction).toEqual({
      turn_id: "t_1",
      tokens_before: 9000,
      tokens_after: 2000,
      summarized_turn_ids: ["t_0"],
      elided_tool_call_ids: ["call_1"],
      elided_file_ids: ["file_1"],
      summary_id: "cs_1",
      summary_written: true,
    });
    expect(after.items).toBe(running.items);
    expect(running.compaction).toBeNull();
  });
});
