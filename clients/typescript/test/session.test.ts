// ChatSession's calls, against a fetch that answers by route and records each request: the documented
// bodies of send, stop, approvals (issue 14) and client tool results, optimistic messages, reload on resync.
import { describe, expect, it } from "vitest";
import { ParleyClient } from "../src/client";
import { ChatSession } from "../src/session";
import { chunkedBody, errorResponse, fixture, sse, until } from "./support";

interface Recorded {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: unknown;
}

function routed(routes: Record<string, (call: Recorded) => Response | Promise<Response>>): { fetch: typeof fetch; calls: Recorded[] } {
  const calls: Recorded[] = [];
  const impl = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const url = new URL(String(input));
    const call: Recorded = {
      method: init?.method ?? "GET",
      path: url.pathname,
      headers: (init?.headers ?? {}) as Record<string, string>,
      body: typeof init?.body === "string" ? JSON.parse(init.body) : null,
    };
    calls.push(call);
    // Nothing waits unless a test says so; the turn view holds no branches.
    const fallback = call.path.endsWith("/pending")
      ? () => json({ pending: [] })
      : call.path.endsWith("/turns")
        ? () => json({ turns: [], next_cursor: null })
        : undefined;
    const route = routes[`${call.method} ${call.path}`] ?? fallback;
    if (!route) return new Promise<Response>(() => undefined);
    return route(call);
  };
  return { fetch: impl as typeof fetch, calls };
}

const json = (body: unknown, status = 200): Response =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
const EMPTY_HISTORY = { chat_messages: [], next_cursor: null, last_event_id: 0 };
const SESSION = { id: "s_1", model: "parley/demo", title: "t", context_used: 0, context_window: 32768, total_tokens: 0 };

function frame(event: Record<string, unknown>): string {
  return `id: ${String(event.seq)}\r\nevent: ${String(event.type)}\r\ndata: ${JSON.stringify(event)}\r\n\r\n`;
}

describe("ChatSession", () => {
  it("send shows the message at once, posts it with its client_message_id as Idempotency-Key, and keeps a failure visible", async () => {
    let fail = false;
    const { fetch, calls } = routed({
      "GET /v1/sessions/s_1/messages": () => json(EMPTY_HISTORY),
      "GET /v1/sessions/s_1": () => json(SESSION),
      "POST /v1/sessions/s_1/messages": () => (fail ? errorResponse(413, "payload_too_large", "too long") : json({ id: "m_1" }, 202)),
    });
    const chat = new ChatSession({ client: new ParleyClient({ baseUrl: "http://p.test", apiKey: "key", fetch }), sessionId: "s_1" });
    await chat.open();
    const sending = chat.send("hello", { delivery: "queue" });
    expect(chat.state.optimistic.map((o) => o.content)).toEqual(["hello"]);
    await sending;
    const post = calls.find((c) => c.method === "POST")!;
    const body = post.body as { content: string; client_message_id: string; delivery: string };
    expect(body).toMatchObject({ content: "hello", delivery: "queue" });
    expect(post.headers["idempotency-key"]).toBe(body.client_message_id);
    expect(post.headers.authorization).toBe("Bearer key");
    fail = true;
    await expect(chat.send("x".repeat(10))).rejects.toMatchObject({ status: 413 });
    expect(chat.state.optimistic.at(-1)?.error).toContain("payload_too_large");
    chat.close();
  });

  it("stop, approve, reject, edit: the documented routes and bodies", async () => {
    const { fetch, calls } = routed({
      "GET /v1/sessions/s_1/messages": () => json(EMPTY_HISTORY),
      "GET /v1/sessions/s_1": () => json(SESSION),
      "POST /v1/sessions/s_1/cancel": () => json({ cancelled: true }, 202),
      "POST /v1/sessions/s_1/approvals": () => json({}),
    });
    const chat = new ChatSession({ client: new ParleyClient({ baseUrl: "http://p.test", fetch }), sessionId: "s_1" });
    await chat.open();
    await chat.stop(true);
    await chat.approve("call_1");
    await chat.reject("call_2", "no");
    await chat.edit("call_3", { q: 1 });
    const sent = calls.filter((c) => c.method === "POST").map((c) => [c.path, c.body]);
    expect(sent).toEqual([
      ["/v1/sessions/s_1/cancel", { clear_queue: true }],
      ["/v1/sessions/s_1/approvals", { decisions: [{ tool_call_id: "call_1", decision: "approve" }] }],
      ["/v1/sessions/s_1/approvals", { decisions: [{ tool_call_id: "call_2", decision: "reject", reason: "no" }] }],
      ["/v1/sessions/s_1/approvals", { decisions: [{ tool_call_id: "call_3", decision: "edit", arguments: { q: 1 } }] }],
    ]);
    chat.close();
  });

  it("answers a client tool request once with its handler's output, and shows the approval it waits for", async () => {
    const base = { session_id: "s_1" };
    const stream =
      "retry: 5\r\n\r\n" +
      frame({ ...base, seq: 1, type: "client_tool_requested", tool_call_id: "c1", name: "browser_info", arguments: { a: 1 }, expires_at: null }) +
      frame({ ...base, seq: 2, type: "approval_requested", tool_call_id: "c2", name: "rm", arguments: { path: "/" }, expires_at: null }) +
      frame({ ...base, seq: 2, type: "approval_requested", tool_call_id: "c2", name: "rm", arguments: { path: "/" }, expires_at: null });
    const { fetch, calls } = routed({
      "GET /v1/sessions/s_1/messages": () => json(EMPTY_HISTORY),
      "GET /v1/sessions/s_1": () => json(SESSION),
      "GET /v1/sessions/s_1/events": () => sse(chunkedBody(stream, 3)),
      "POST /v1/sessions/s_1/tool_results": () => json({}),
    });
    const chat = new ChatSession({ client: new ParleyClient({ baseUrl: "http://p.test", fetch }), sessionId: "s_1" });
    chat.registerClientTool("browser_info", { description: "d", parameters: {} }, (args) => ({ echo: args }));
    expect(chat.clientTools()).toEqual([{ name: "browser_info", description: "d", parameters: {} }]);
    await chat.open();
    await until(() => calls.some((c) => c.path.endsWith("/tool_results")) && chat.state.approvals.length === 1);
    chat.close();
    const results = calls.filter((c) => c.path.endsWith("/tool_results"));
    expect(results.map((c) => c.body)).toEqual([{ results: [{ tool_call_id: "c1", output: { echo: { a: 1 } } }] }]);
    expect(chat.state.status).toBe("awaiting_input");
    expect(chat.state.approvals).toEqual([{ toolCallId: "c2", name: "rm", arguments: { path: "/" }, expiresAt: null, decisions: ["approve", "reject", "edit"] }]);
  });

  it("at open shows the approvals that wait and answers the client tool requests that wait (a page that reloads)", async () => {
    const waiting = (kind: string, id: string, name: string, args: unknown) => ({
      tool_call_id: id, kind, id: `m_${id}`, turn_id: "t_1", name, arguments: args,
      requested_at: "2026-11-23T10:00:00+00:00", expires_at: "2026-11-23T10:15:00+00:00",
      decisions: kind === "approval" ? ["approve", "edit", "reject"] : null,
    });
    const history = { chat_messages: [{ type: "turn_start", id: "m_t", turn_id: "t_1", timestamp: "2026-11-23T10:00:00+00:00" }], next_cursor: null, last_event_id: 7 };
    const { fetch, calls } = routed({
      "GET /v1/sessions/s_1/messages": () => json(history),
      "GET /v1/sessions/s_1": () => json(SESSION),
      "GET /v1/sessions/s_1/pending": () => json({ pending: [waiting("approval", "a1", "calculate", { expression: "1+1" }), waiting("client_tool", "c1", "get_browser_time", {})] }),
      "POST /v1/sessions/s_1/tool_results": () => json({}),
    });
    const chat = new ChatSession({ client: new ParleyClient({ baseUrl: "http://p.test", fetch }), sessionId: "s_1" });
    chat.registerClientTool("get_browser_time", { description: "d", parameters: {} }, () => "10:00");
    await chat.open();
    await until(() => calls.some((c) => c.path.endsWith("/tool_results")));
    chat.close();
    expect(chat.state.status).toBe("awaiting_input");
    expect(chat.state.approvals).toEqual([{ toolCallId: "a1", name: "calculate", arguments: { expression: "1+1" }, expiresAt: "2026-11-23T10:15:00+00:00", decisions: ["approve", "edit", "reject"] }]);
    expect(calls.filter((c) => c.path.endsWith("/tool_results")).map((c) => c.body)).toEqual([{ results: [{ tool_call_id: "c1", output: "10:00" }] }]);
    // the history first, then what waits: a request answered in between comes again on the stream
    const reads = calls.filter((c) => c.method === "GET").map((c) => c.path);
    expect(reads.indexOf("/v1/sessions/s_1/pending")).toBeGreaterThan(reads.indexOf("/v1/sessions/s_1/messages"));
  });

  it("on resync reads the history again and renders it, then goes on", async () => {
    const { history, raw } = fixture("time");
    let reads = 0;
    const resync = frame({ type: "resync", seq: history.last_event_id, session_id: "s_1", last_event_id: history.last_event_id, reason: "expired" });
    // As a real server does: the resync answers the unreplayable position only; the resumed stream (from
    // the resync's last_event_id) is an idle one. (Answering every connection with the resync made the
    // client resync again after each 5 ms backoff, so `resyncs === 1` held only between two polls: the
    // wait timed out whenever the machine was slow enough that a poll came after the second resync.)
    let streams = 0;
    const { fetch, calls } = routed({
      "GET /v1/sessions/s_1/messages": () => json(reads++ === 0 ? EMPTY_HISTORY : history),
      "GET /v1/sessions/s_1": () => json({ ...SESSION, context_used: 3277, total_tokens: 5000 }),
      "GET /v1/sessions/s_1/events": () =>
        streams++ === 0 ? sse(chunkedBody("retry: 5\r\n\r\n" + resync, 1)) : new Promise<Response>(() => undefined),
    });
    const chat = new ChatSession({ client: new ParleyClient({ baseUrl: "http://p.test", fetch }), sessionId: "s_1" });
    await chat.open();
    await until(() => streams === 2); // resumed after the resync: everything before is settled
    chat.close();
    expect(chat.state.resyncs).toBe(1);
    expect(reads).toBe(2);
    const resumed = calls.filter((c) => c.path.endsWith("/events")).at(-1)!;
    expect(resumed.headers["last-event-id"]).toBe(String(history.last_event_id));
    expect(chat.state.items.map((i) => i.id)).toEqual(history.chat_messages.map((r) => r.id));
    expect(chat.state.lastSeq).toBe(history.last_event_id);
    // the header before any token_usage event: the session's stored totals
    expect(chat.state.usage).toMatchObject({ context_percent: 10, session_total_tokens: 5000 });
    expect(raw.length).toBeGreaterThan(0);
  });
});
