// Helpers of the vitest suites: the recorded fixtures, and a fetch that serves them.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import type { HistoryPage, ParleyEvent } from "../src/types";

const FIXTURES = fileURLToPath(new URL("../fixtures/", import.meta.url));

export interface Fixture {
  raw: string;
  history: HistoryPage;
  /** The frames' events, parsed here independently of the client (for the expectations only). */
  events: ParleyEvent[];
}

export function fixture(name: string): Fixture {
  const raw = readFileSync(`${FIXTURES}${name}.sse`, "utf8");
  const history = JSON.parse(readFileSync(`${FIXTURES}${name}.history.json`, "utf8")) as HistoryPage;
  const events = raw
    .split(/\r?\n/)
    .filter((line) => line.startsWith("data: "))
    .map((line) => JSON.parse(line.slice(6)) as ParleyEvent);
  return { raw, history, events };
}

/** The raw stream from the frame after `afterSeq` on (the retry hint first), as a server resuming would. */
export function framesAfter(raw: string, afterSeq: number, upTo = Infinity): string {
  // Recorded before the service ended its lines in LF (CRLF then); a fresh recording has LF.
  const end = raw.includes("\r\n\r\n") ? "\r\n\r\n" : "\n\n";
  const [head, ...frames] = raw.split(end);
  const kept = frames.filter((f) => {
    const id = /^id: (\d+)/m.exec(f);
    return id === null ? f.trim() !== "" : Number(id[1]) > afterSeq && Number(id[1]) <= upTo;
  });
  return [head, ...kept].join(end) + end;
}

/** A body that delivers `text` in chunks of random sizes (splitting lines, even CRLF pairs), then ends or fails. */
export function chunkedBody(text: string, seed: number, fail = false): ReadableStream<Uint8Array> {
  const bytes = new TextEncoder().encode(text);
  let position = 0;
  let state = seed;
  const random = (): number => {
    state = (state * 1103515245 + 12345) % 2 ** 31;
    return state / 2 ** 31;
  };
  return new ReadableStream({
    pull(controller) {
      if (position >= bytes.length) {
        if (fail) controller.error(new TypeError("network error: connection reset"));
        else controller.close();
        return;
      }
      const size = 1 + Math.floor(random() * 200);
      controller.enqueue(bytes.slice(position, position + size));
      position += size;
    },
  });
}

export interface Call {
  url: string;
  headers: Record<string, string>;
}

/** A fetch whose answers are given in order; records each call's URL and headers. */
export function scriptedFetch(answers: (() => Response)[]): { fetch: typeof fetch; calls: Call[] } {
  const calls: Call[] = [];
  const impl = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const headers = Object.fromEntries(Object.entries((init?.headers ?? {}) as Record<string, string>));
    calls.push({ url: String(input), headers });
    const answer = answers[calls.length - 1];
    if (!answer) return new Promise<Response>(() => undefined); // hangs, as an idle stream would
    return answer();
  };
  return { fetch: impl as typeof fetch, calls };
}

export function sse(body: ReadableStream<Uint8Array>): Response {
  return new Response(body, { status: 200, headers: { "content-type": "text/event-stream" } });
}

export function errorResponse(status: number, code: string, message: string): Response {
  return new Response(JSON.stringify({ error: { code, message, request_id: "r_test" } }), {
    status,
    headers: { "content-type": "application/json" },
  });
}

export async function until(check: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 5));
  }
}
