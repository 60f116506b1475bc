// The stream's connection handling, against scripted answers: what is retried, what is not, what it reports.
import { describe, expect, it } from "vitest";
import { ParleyHttpError } from "../src/errors";
import { SessionStream, type ConnectionState } from "../src/stream";
import type { ParleyEvent } from "../src/types";
import { chunkedBody, errorResponse, fixture, framesAfter, scriptedFetch, sse, until } from "./support";

function open(fetchImpl: typeof globalThis.fetch, extra: Partial<ConstructorParameters<typeof SessionStream>[0]> = {}) {
  const states: ConnectionState[] = [];
  const events: ParleyEvent[] = [];
  const stream = new SessionStream({
    baseUrl: "http://parley.test/",
    sessionId: "s_1",
    apiKey: "k".repeat(20),
    fetch: fetchImpl,
    initialDelayMs: 5,
    onEvent: (e) => events.push(e),
    onState: (s) => states.push(s),
    ...extra,
  });
  const done = stream.start();
  return { stream, states, events, done };
}

describe("SessionStream", () => {
  it.each([401, 404])("closes on %i with the error body, without retrying", async (status) => {
    const { fetch, calls } = scriptedFetch([() => errorResponse(status, "unauthorized", "The API key is not valid.")]);
    const { stream, states, done } = open(fetch);
    await done;
    expect(calls).toHaveLength(1);
    expect(calls[0]!.headers.authorization).toBe(`Bearer ${"k".repeat(20)}`);
    expect(calls[0]!.url).toBe("http://parley.test/v1/sessions/s_1/events");
    expect(stream.state.status).toBe("closed");
    const error = stream.state.error as ParleyHttpError;
    expect(error).toBeInstanceOf(ParleyHttpError);
    expect([error.status, error.code, error.body?.message]).toEqual([status, "unauthorized", "The API key is not valid."]);
    expect(states.map((s) => s.status)).toEqual(["connecting", "closed"]);
  });

  it("retries a 503 and a network failure with growing, jittered delays, then opens", async () => {
    const raw = fixture("time").raw.replace("retry: 2000", "retry: 5");
    const { fetch, calls } = scriptedFetch([
      () => errorResponse(503, "storage_busy", "busy"),
      () => {
        throw new TypeError("fetch failed");
      },
      () => sse(chunkedBody(raw, 1)),
    ]);
    const { stream, states, events } = open(fetch, { random: () => 1 });
    await until(() => calls.length === 4);
    stream.close();
    const waits = states.filter((s) => s.retryInMs !== null).map((s) => [s.attempt, s.retryInMs]);
    expect(waits.slice(0, 2)).toEqual([[1, 5], [2, 10]]); // initialDelayMs doubling (random() = 1: the ceiling)
    expect(states.find((s) => s.status === "reconnecting" && s.error instanceof ParleyHttpError)?.error).toMatchObject({ status: 503 });
    expect(states.some((s) => s.status === "open")).toBe(true);
    expect(events.map((e) => e.seq)).toEqual(fixture("time").events.map((e) => e.seq));
    // once open, the stream's end starts over from attempt 1, sending the last seq
    expect(calls[3]!.headers["last-event-id"]).toBe(String(events.at(-1)!.seq));
  });

  it("gives up after maxAttempts failures in a row, reporting the last error", async () => {
    const { fetch, calls } = scriptedFetch(Array.from({ length: 5 }, () => () => errorResponse(502, "bad_gateway", "x")));
    const { stream, done } = open(fetch, { maxAttempts: 2 });
    await done;
    expect(calls).toHaveLength(3);
    expect(stream.state).toMatchObject({ status: "closed", error: { status: 502 } });
  });

  it("on resync reloads first, then goes on after the session's current position", async () => {
    const { raw, events: recorded } = fixture("time");
    const last = recorded.at(-1)!.seq;
    const resync = `retry: 5\r\n\r\nid: ${last - 2}\r\nevent: resync\r\ndata: {"type":"resync","seq":${last - 2},"session_id":"s_1","last_event_id":${last - 2},"reason":"expired"}\r\n\r\n`;
    const tail = framesAfter(raw, last - 2).replace(/^retry: \d+\r\n\r\n/, "");
    const order: string[] = [];
    const { fetch, calls } = scriptedFetch([() => sse(chunkedBody(resync + tail, 2))]);
    const { stream, events } = open(fetch, {
      after: 99_999,
      onResync: async (e) => {
        order.push(`reload at ${e.last_event_id}`);
        await new Promise((r) => setTimeout(r, 20));
      },
      onEvent: (e) => order.push(e.type),
    });
    await until(() => calls.length === 2);
    stream.close();
    expect(calls[0]!.url).toContain("after=99999");
    expect(order.slice(0, 4)).toEqual([`reload at ${last - 2}`, "resync", "agent_status", "turn_done"]);
    expect(events).toEqual([]);
    expect(calls[1]!.headers["last-event-id"]).toBe(String(last));
  });
});
