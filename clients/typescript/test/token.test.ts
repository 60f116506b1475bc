// A token source instead of a fixed key: asked once, asked again after a 401 or before its `exp`, on the
// REST side and on the stream alike.
import { describe, expect, it } from "vitest";
import { ParleyClient, TOKEN_REFRESH_MARGIN_MS, tokenExpiry } from "../src/client";
import { ParleyHttpError } from "../src/errors";
import { SessionStream } from "../src/stream";
import { chunkedBody, errorResponse, fixture, scriptedFetch, sse, until } from "./support";

function jwtWithExp(exp: number, sub = "alice"): string {
  const part = (value: object) => btoa(JSON.stringify(value)).replace(/=+$/, "").replace(/\+/g, "-").replace(/\//g, "_");
  return `${part({ alg: "HS256", typ: "JWT" })}.${part({ sub, exp })}.c2lnbmF0dXJl`;
}

function ok(body: unknown): Response {
  return new Response(JSON.stringify(body), { status: 200, headers: { "content-type": "application/json" } });
}

function provider(tokens: string[]) {
  const asked: boolean[] = [];
  const source = (refresh: boolean) => {
    asked.push(refresh);
    return tokens[asked.length - 1] ?? null;
  };
  return { source, asked };
}

const later = () => Math.floor(Date.now() / 1000) + 3600;

describe("token source", () => {
  it("reads a JWT's expiry, and nothing from a key", () => {
    expect(tokenExpiry(jwtWithExp(2_000_000_000))).toBe(2_000_000_000_000);
    expect(tokenExpiry("k".repeat(20))).toBeNull();
    expect(tokenExpiry("a.b.c")).toBeNull();
  });

  it("sends the token, keeps it, and asks again once after a 401", async () => {
    const [first, second] = [jwtWithExp(later(), "one"), jwtWithExp(later(), "two")];
    const { source, asked } = provider([first, second]);
    const { fetch, calls } = scriptedFetch([
      () => ok({ sessions: [], next_cursor: null }),
      () => errorResponse(401, "invalid_token", "The token has expired (`exp`)."),
      () => ok({ sessions: [], next_cursor: null }),
    ]);
    const client = new ParleyClient({ baseUrl: "http://parley.test", token: source, fetch });
    await client.listSessions();
    await client.listSessions();
    expect(calls.map((c) => c.headers.authorization)).toEqual([`Bearer ${first}`, `Bearer ${first}`, `Bearer ${second}`]);
    expect(asked).toEqual([false, true]);
  });

  it("uploads a file and reads its bytes with the token, asking again after a 401; progress once sent", async () => {
    const [first, second] = [jwtWithExp(later(), "one"), jwtWithExp(later(), "two")];
    const { source, asked } = provider([first, second]);
    const stored = { id: "f_0123456789abcdef", name: "a.txt", media_type: "text/plain", size: 5 };
    const { fetch, calls } = scriptedFetch([
      () => errorResponse(401, "invalid_token", "The token has expired (`exp`)."),
      () => new Response(JSON.stringify(stored), { status: 201, headers: { "content-type": "application/json" } }),
      () => new Response("hello", { status: 200, headers: { "content-type": "text/plain" } }),
    ]);
    const client = new ParleyClient({ baseUrl: "http://parley.test", token: source, fetch });
    const progress: [number, number][] = [];
    const file = await client.uploadFile(new Blob(["hello"]), "a.txt", { onProgress: (sent, total) => progress.push([sent, total]) });
    expect(file).toEqual(stored);
    expect(progress).toEqual([[5, 5]]); // no XMLHttpRequest in Node: once, when sent
    expect(await (await client.fileContent(file.id)).text()).toBe("hello");
    expect(calls.map((c) => [c.url, c.headers.authorization])).toEqual([
      ["http://parley.test/v1/files", `Bearer ${first}`],
      ["http://parley.test/v1/files", `Bearer ${second}`],
      [`http://parley.test/v1/files/${file.id}/content`, `Bearer ${second}`],
    ]);
    expect(asked).toEqual([false, true]);
  });

  it("gives up after the renewed token is refused too", async () => {
    const { source, asked } = provider([jwtWithExp(later()), jwtWithExp(later())]);
    const { fetch, calls } = scriptedFetch([
      () => errorResponse(401, "invalid_token", "The token's signature does not verify."),
      () => errorResponse(401, "invalid_token", "The token's signature does not verify."),
    ]);
    const client = new ParleyClient({ baseUrl: "http://parley.test", token: source, fetch });
    await expect(client.listSessions()).rejects.toMatchObject({ status: 401, code: "invalid_token" });
    expect(calls).toHaveLength(2);
    expect(asked).toEqual([false, true]);
  });

  it("asks for a new token before sending one about to expire", async () => {
    const soon = Math.floor((Date.now() + TOKEN_REFRESH_MARGIN_MS / 2) / 1000);
    const fresh = jwtWithExp(later());
    const { source, asked } = provider([jwtWithExp(soon), fresh]);
    const { fetch, calls } = scriptedFetch([() => ok({ sessions: [], next_cursor: null }), () => ok({ sessions: [], next_cursor: null })]);
    const client = new ParleyClient({ baseUrl: "http://parley.test", token: source, fetch });
    await client.listSessions();
    await client.listSessions();
    expect(asked).toEqual([false, true]);
    expect(calls[1]!.headers.authorization).toBe(`Bearer ${fresh}`);
  });

  it("reconnects a stream refused with 401 once, with a renewed token, then opens", async () => {
    const [first, second] = [jwtWithExp(later(), "one"), jwtWithExp(later(), "two")];
    const { source, asked } = provider([first, second]);
    const client = new ParleyClient({ baseUrl: "http://parley.test", token: source, fetch: globalThis.fetch });
    const { fetch, calls } = scriptedFetch([
      () => errorResponse(401, "invalid_token", "The token has expired (`exp`)."),
      () => sse(chunkedBody(fixture("time").raw, 3)),
    ]);
    const stream = new SessionStream({
      baseUrl: "http://parley.test",
      sessionId: "s_1",
      credential: (refresh) => client.credential(refresh),
      fetch,
      initialDelayMs: 5,
      onEvent: () => undefined,
    });
    void stream.start();
    await until(() => stream.state.status === "open" || calls.length >= 3);
    stream.close();
    expect(calls.slice(0, 2).map((c) => c.headers.authorization)).toEqual([`Bearer ${first}`, `Bearer ${second}`]);
    expect(asked).toEqual([false, true]);
  });

  it("closes a stream whose renewed token is refused as well", async () => {
    const { source } = provider([jwtWithExp(later()), jwtWithExp(later())]);
    const client = new ParleyClient({ baseUrl: "http://parley.test", token: source, fetch: globalThis.fetch });
    const { fetch, calls } = scriptedFetch([
      () => errorResponse(401, "invalid_token", "no"),
      () => errorResponse(401, "invalid_token", "no"),
    ]);
    const stream = new SessionStream({
      baseUrl: "http://parley.test",
      sessionId: "s_1",
      credential: (refresh) => client.credential(refresh),
      fetch,
      onEvent: () => undefined,
    });
    await stream.start();
    expect(calls).toHaveLength(2);
    expect(stream.state.status).toBe("closed");
    expect((stream.state.error as ParleyHttpError).status).toBe(401);
  });
});
