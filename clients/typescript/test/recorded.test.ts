// The recorded streams of the real service (fixtures/, scripts/capture_fixtures.py) through the client:
// the stream's events reduced from nothing must render exactly what the history of the same session says
// once the turn ended. A reducer that dropped, doubled or misplaced a delta, a duration, a model, an
// interrupted mark or a queued message would differ from the server's own rows.
import { describe, expect, it } from "vitest";
import { emptyState, fromHistory, reduce, transcript, type ChatItem, type ChatState } from "../src/reduce";
import { SessionStream } from "../src/stream";
import type { ParleyEvent } from "../src/types";
import { chunkedBody, fixture, framesAfter, scriptedFetch, sse, until } from "./support";

const NAMES = ["time", "stop", "queued", "calc"];

/** Items without what only a live view has (streaming flags). */
const comparable = (items: ChatItem[]): unknown[] =>
  items.map((i) => (i.kind === "assistant" ? { ...i, streaming: false } : i.kind === "user" ? { ...i, turnId: null } : i));

async function replay(raw: string, seed: number): Promise<ChatState> {
  let state = emptyState();
  const { fetch } = scriptedFetch([() => sse(chunkedBody(raw, seed))]);
  const stream = new SessionStream({
    baseUrl: "http://parley.test",
    sessionId: "s",
    fetch,
    after: 0,
    onEvent: (event) => (state = reduce(state, event)),
  });
  void stream.start();
  await until(() => stream.state.status === "reconnecting");
  stream.close();
  return state;
}

describe.each(NAMES)("the recorded %s stream", (name) => {
  const { raw, history, events } = fixture(name);
  const expected = fromHistory(history.chat_messages, history.last_event_id);

  it("reduces to the history the server stored, whatever the chunking", async () => {
    for (const seed of [1, 7, 42]) {
      const state = await replay(raw, seed);
      expect(comparable(state.items)).toEqual(comparable(expected.items));
      expect(state.lastSeq).toBe(history.last_event_id);
      expect(state.status).toBe("idle");
      expect(state.runningTurnId).toBeNull();
    }
  });

  it("reduces purely: the same events give the same state, and no state is changed in place", () => {
    const frozen = (s: ChatState): ChatState => structuredClone(s);
    let state = emptyState();
    for (const event of events) {
      const before = frozen(state);
      const next = reduce(state, event);
      expect(state).toEqual(before);
      state = next;
    }
    const again = events.reduce(reduce, emptyState());
    expect(again).toEqual(state);
  });

  it("resumes after a cut at any frame, dropping what it saw twice", async () => {
    const whole = await replay(raw, 3);
    for (const cut of [1, Math.floor(events.length / 3), events.length - 2]) {
      let state = emptyState();
      const seen: ParleyEvent[] = [];
      const cutAt = events[cut - 1]!.seq;
      const fast = raw.replace("retry: 2000", "retry: 10");
      const { fetch, calls } = scriptedFetch([
        () => sse(chunkedBody(framesAfter(fast, 0, cutAt), 5, true)),
        // the server resumes from Last-Event-ID; an overlap of three frames must be dropped
        () => sse(chunkedBody(framesAfter(fast, Math.max(0, cutAt - 3)), 9)),
      ]);
      const delays: number[] = [];
      const stream = new SessionStream({
        baseUrl: "http://parley.test",
        sessionId: "s",
        fetch,
        after: 0,
        onEvent: (event) => {
          seen.push(event);
          state = reduce(state, event);
        },
        onState: (s) => s.retryInMs !== null && delays.push(s.retryInMs),
      });
      void stream.start();
      await until(() => calls.length === 3 || stream.state.status === "closed");
      stream.close();
      expect(calls[1]!.headers["last-event-id"]).toBe(String(cutAt));
      expect(delays[0]).toBeGreaterThanOrEqual(5); // the retry: hint (10 ms), with jitter over its upper half
      expect(delays[0]).toBeLessThanOrEqual(10);
      expect(seen.map((e) => e.seq)).toEqual(events.map((e) => e.seq));
      expect(transcript(state)).toEqual(transcript(whole));
    }
  });
});

describe("what the recordings show", () => {
  it("time: the tool group with its server-measured duration, and the context percentage", () => {
    const state = fixture("time").events.reduce(reduce, emptyState());
    const tool = state.items.find((i) => i.kind === "tool_group");
    expect(tool).toMatchObject({ toolName: "current_time", isError: false });
    expect(tool && tool.kind === "tool_group" && tool.durationMs).toBeGreaterThanOrEqual(0);
    expect(state.usage?.context_percent).toBeGreaterThan(0);
    expect(state.items.find((i) => i.kind === "user")).toMatchObject({ clientMessageId: "cm-time-1" });
  });

  it("stop: the partial text is kept and marked interrupted, the turn cancelled", () => {
    const state = fixture("stop").events.reduce(reduce, emptyState());
    const text = state.items.find((i) => i.kind === "assistant");
    expect(text).toMatchObject({ interrupted: true, streaming: false });
    expect(state.items.at(-1)).toMatchObject({ kind: "turn_done", status: "cancelled" });
  });

  it("queued: the waiting message is in the queue, not the transcript, until a turn takes it", () => {
    const { events } = fixture("queued");
    let state = emptyState();
    let sawQueued = false;
    for (const event of events) {
      state = reduce(state, event);
      if (state.queue.some((q) => q.client_message_id === "cm-q-2")) {
        sawQueued = true;
        expect(state.items.some((i) => i.kind === "user" && i.clientMessageId === "cm-q-2")).toBe(false);
      }
    }
    expect(sawQueued).toBe(true);
    expect(state.queue).toEqual([]);
    const users = state.items.filter((i) => i.kind === "user").map((i) => (i.kind === "user" ? i.content : ""));
    expect(users).toEqual(["[long] first", "and then?"]);
  });
});
