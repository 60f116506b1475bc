// Branches (docs/api.md, Branches): the client's regenerate, edit, activate and fork send the documented
// routes and bodies; the reducer keeps each turn's siblings and follows branch_changed; a ChatSession reads
// the history and the turn view again when the active path changes (here or in another tab).
import { describe, expect, it } from "vitest";
import { ParleyClient } from "../src/client";
import { emptyState, fromTurns, reduce, siblingTurn } from "../src/reduce";
import { ChatSession } from "../src/session";
import type { ParleyEvent, Turn } from "../src/types";
import { chunkedBody, sse, until } from "./support";

const AT = "2026-11-29T10:00:00+00:00";
const json = (body: unknown, status = 200): Response =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });

function turn(turnId: string, parent: string | null, siblings: string[]): Turn {
  return {
    turn_id: turnId,
    status: "completed",
    started_at: AT,
    ended_at: AT,
    duration_seconds: 0.1,
    user_messages: [],
    nodes: [],
    final_answer: null,
    error: null,
    parent_turn_id: parent,
    siblings,
    sibling_index: siblings.indexOf(turnId),
  };
}

const row = (id: string, turnId: string, type: "turn_start" | "turn_done") =>
  type === "turn_start"
    ? { id, type, turn_id: turnId, timestamp: AT }
    : { id, type, turn_id: turnId, timestamp: AT, duration_seconds: 0.1, status: "completed" };

describe("branches in the reducer", () => {
  it("keeps each turn's siblings and steps through them with the arrows", () => {
    const state = fromTurns(emptyState(), [turn("t_1", null, ["t_1"]), turn("t_3", "t_1", ["t_2", "t_3", "t_4"])]);
    expect(state.branches.t_3).toEqual({ parentTurnId: "t_1", siblings: ["t_2", "t_3", "t_4"], index: 1 });
    expect([siblingTurn(state, "t_3", -1), siblingTurn(state, "t_3", 1)]).toEqual(["t_2", "t_4"]);
    expect([siblingTurn(state, "t_1", -1), siblingTurn(state, "t_1", 1), siblingTurn(state, "t_9", 1)]).toEqual([null, null, null]);
  });

  it("branch_changed names the new head, counts the change and drops turns off the path", () => {
    const state = fromTurns(emptyState(), [turn("t_1", null, ["t_1"]), turn("t_3", "t_1", ["t_2", "t_3"])]);
    const event = { type: "branch_changed", seq: 9, session_id: "s_1", head_turn_id: "t_2", path_turn_ids: ["t_1", "t_2"] } as ParleyEvent;
    const after = reduce(state, event);
    expect([after.headTurnId, after.branchChanges, after.lastSeq]).toEqual(["t_2", 1, 9]);
    expect(Object.keys(after.branches)).toEqual(["t_1"]);
    expect(state.branchChanges).toBe(0); // pure
  });
});

describe("branches in the client and ChatSession", () => {
  it("regenerate, edit, activate and fork: the documented routes, bodies and keys; branch_changed reloads", async () => {
    const calls: { method: string; path: string; body: unknown; headers: Record<string, string> }[] = [];
    let historyReads = 0;
    const changed = `id: 3\r\nevent: branch_changed\r\ndata: ${JSON.stringify({ type: "branch_changed", seq: 3, session_id: "s_1", head_turn_id: "t_2", path_turn_ids: ["t_2"] })}\r\n\r\n`;
    let streams = 0;
    const fetchImpl = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
      const url = new URL(String(input));
      const method = init?.method ?? "GET";
      calls.push({ method, path: url.pathname, body: typeof init?.body === "string" ? JSON.parse(init.body) : null, headers: (init?.headers ?? {}) as Record<string, string> });
      const key = `${method} ${url.pathname}`;
      if (key === "GET /v1/sessions/s_1") return json({ id: "s_1", model: "m", total_tokens: 0, context_used: 0, context_window: null });
      if (key === "GET /v1/sessions/s_1/messages") {
        historyReads += 1;
        const turnId = historyReads === 1 ? "t_1" : "t_2";
        return json({ chat_messages: [row(`m_${turnId}s`, turnId, "turn_start"), row(`m_${turnId}d`, turnId, "turn_done")], next_cursor: null, last_event_id: 2 });
      }
      if (key === "GET /v1/sessions/s_1/turns") {
        const head = historyReads <= 1 ? "t_1" : "t_2";
        return json({ turns: [turn(head, null, ["t_1", "t_2"])], next_cursor: null });
      }
      if (key === "GET /v1/sessions/s_1/pending") return json({ pending: [] });
      if (key === "GET /v1/sessions/s_1/events") return streams++ === 0 ? sse(chunkedBody(changed, 1)) : new Promise<Response>(() => undefined);
      if (key.endsWith("/regenerate") || key.endsWith("/edit")) return json({ session_id: "s_1", turn_id: "t_2", parent_turn_id: null, sibling_of: "t_1", user_message_ids: ["m_x"] }, 202);
      if (key.endsWith("/activate")) return json({ session_id: "s_1", head_turn_id: "t_1", path_turn_ids: ["t_1"] });
      if (key === "POST /v1/sessions/s_1/fork") return json({ id: "s_2" }, 201);
      return new Promise<Response>(() => undefined);
    };
    const client = new ParleyClient({ baseUrl: "http://p.test", fetch: fetchImpl as typeof fetch });
    const chat = new ChatSession({ client, sessionId: "s_1" });
    await chat.open();
    await until(() => chat.state.branchChanges === 1 && historyReads === 2);
    await until(() => chat.state.branches.t_2 !== undefined);
    expect(chat.state.items.map((i) => i.id)).toEqual(["m_t_2s", "m_t_2d"]);
    expect(chat.state.branches.t_2).toEqual({ parentTurnId: null, siblings: ["t_1", "t_2"], index: 1 });

    await chat.regenerate("t_1", { model: "other" });
    await chat.editMessage("t_1", "again");
    await chat.activate("t_1");
    await chat.fork("t_1");
    chat.close();
    const posts = calls.filter((c) => c.method === "POST");
    expect(posts.map((c) => [c.path, c.body])).toEqual([
      ["/v1/sessions/s_1/turns/t_1/regenerate", { model: "other" }],
      ["/v1/sessions/s_1/turns/t_1/edit", { content: "again" }],
      ["/v1/sessions/s_1/turns/t_1/activate", {}],
      ["/v1/sessions/s_1/fork", { turn_id: "t_1" }],
    ]);
    // Regenerate, edit and fork carry an Idempotency-Key (a retry of the same click is safe).
    expect(posts.map((c) => Boolean(c.headers["idempotency-key"]))).toEqual([true, true, false, true]);
  });

  it("events that come while the history is read again are applied after it, none lost", async () => {
    const frames = [
      { type: "branch_changed", seq: 3, session_id: "s_1", head_turn_id: "t_2", path_turn_ids: ["t_2"] },
      { type: "turn_start", seq: 4, session_id: "s_1", id: "m_t_3s", turn_id: "t_3", timestamp: AT },
    ].map((e) => `id: ${e.seq}\r\nevent: ${e.type}\r\ndata: ${JSON.stringify(e)}\r\n\r\n`);
    let historyReads = 0;
    let release: () => void = () => undefined;
    const held = new Promise<void>((resolve) => (release = resolve));
    let streams = 0;
    const fetchImpl = async (input: RequestInfo | URL): Promise<Response> => {
      const path = new URL(String(input)).pathname;
      if (path === "/v1/sessions/s_1") return json({ id: "s_1", model: "m", total_tokens: 0, context_used: 0, context_window: null });
      if (path.endsWith("/messages")) {
        historyReads += 1;
        if (historyReads === 1) return json({ chat_messages: [row("m_t_1s", "t_1", "turn_start"), row("m_t_1d", "t_1", "turn_done")], next_cursor: null, last_event_id: 2 });
        await held; // the stream's next event arrives while this read is on its way
        return json({ chat_messages: [row("m_t_2s", "t_2", "turn_start"), row("m_t_2d", "t_2", "turn_done")], next_cursor: null, last_event_id: 3 });
      }
      if (path.endsWith("/turns")) return json({ turns: [], next_cursor: null });
      if (path.endsWith("/pending")) return json({ pending: [] });
      if (path.endsWith("/events")) return streams++ === 0 ? sse(chunkedBody(frames.join(""), 1)) : new Promise<Response>(() => undefined);
      return new Promise<Response>(() => undefined);
    };
    const chat = new ChatSession({ client: new ParleyClient({ baseUrl: "http://p.test", fetch: fetchImpl as typeof fetch }), sessionId: "s_1" });
    await chat.open();
    await until(() => historyReads === 2);
    await new Promise((resolve) => setTimeout(resolve, 50)); // the turn_start frame is read meanwhile
    release();
    await until(() => chat.state.lastSeq === 4);
    chat.close();
    expect(chat.state.items.map((i) => i.id)).toEqual(["m_t_2s", "m_t_2d", "m_t_3s"]);
    expect(chat.state.runningTurnId).toBe("t_3");
  });
});
