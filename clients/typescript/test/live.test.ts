// The client against a live server: `python -m uvicorn app.main:app` from this repository (its virtualenv,
// a fresh SQLite file, a bearer key), on a free port. Without the virtualenv this suite is skipped with one
// line; under CI=true that is a failure.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ChatSession, ParleyClient, ParleyHttpError, SessionStream, fromHistory, transcript } from "../src/index";
import { until } from "./support";

const ROOT = fileURLToPath(new URL("../../../", import.meta.url));
const PYTHON = join(ROOT, ".venv/bin/python");
const KEY = "live-test-key-0123456789abcdef";
const available = existsSync(PYTHON);
if (!available) {
  const line = `live client tests skipped: ${PYTHON} is missing (run make setup)`;
  if (process.env.CI === "true") throw new Error(`${line}; CI=true makes that a failure`);
  console.warn(line);
}

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const server = createServer().listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
}

describe.runIf(available)("against a live server", () => {
  let server: ChildProcess;
  let base = "";
  let dir = "";
  let log = "";

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "parley-client-"));
    const env = {
      ...process.env,
      PARLEY_DATABASE_URL: `sqlite+aiosqlite:///${dir}/parley.db`,
      PARLEY_API_KEYS: `alice:${KEY}`,
      PARLEY_DEMO_TOKEN_DELAY: "0.01",
      PARLEY_SSE_RETRY_MS: "200",
    };
    const migrated = spawnSync(PYTHON, ["-m", "alembic", "upgrade", "head"], { cwd: ROOT, env, encoding: "utf8" });
    expect(migrated.status, migrated.stderr).toBe(0);
    const port = await freePort();
    base = `http://127.0.0.1:${port}`;
    server = spawn(PYTHON, ["-m", "uvicorn", "app.main:app", "--port", String(port), "--no-access-log"], { cwd: ROOT, env });
    server.stdout?.on("data", (d: Buffer) => (log += d.toString()));
    server.stderr?.on("data", (d: Buffer) => (log += d.toString()));
    // Ready when /readyz says so: uvicorn logs "startup complete" before its socket listens, and the model
    // layer loads after that (a request in between is refused, or waits for the load).
    let ready = false;
    const deadline = Date.now() + 30_000;
    while (!ready && server.exitCode === null && Date.now() < deadline) {
      ready = await fetch(`${base}/readyz`).then((r) => r.status === 200, () => false);
      if (!ready) await new Promise((r) => setTimeout(r, 50));
    }
    expect(server.exitCode, log).toBeNull();
    expect(ready, log).toBe(true);
  }, 60_000);

  afterAll(() => {
    server?.kill("SIGKILL");
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("sends, streams the answer with its tool, and ends where the history ends", async () => {
    const client = new ParleyClient({ baseUrl: base, apiKey: KEY });
    const created = await client.createSession({ title: "live" });
    const chat = new ChatSession({ client, sessionId: created.id });
    await chat.open();
    await until(() => chat.connection.status === "open");
    const sent = chat.send("what time is it?");
    expect(chat.state.optimistic).toHaveLength(1); // shown before the server answered
    await sent;
    await until(() => chat.state.items.some((i) => i.kind === "turn_done"), 20_000);
    expect(chat.state.optimistic).toEqual([]);
    expect(chat.state.items.find((i) => i.kind === "tool_group")).toMatchObject({ toolName: "current_time", isError: false });
    const { rows, lastEventId } = await client.history(created.id);
    await until(() => chat.state.lastSeq >= lastEventId);
    expect(transcript(chat.state)).toEqual(transcript(fromHistory(rows, lastEventId)));
    expect(chat.state.usage?.context_percent).toBeGreaterThan(0);
    chat.close();
  });

  it("uploadFile stores a screenshot; send() attaches it and the demo model describes what it received", async () => {
    const client = new ParleyClient({ baseUrl: base, apiKey: KEY });
    const png = Uint8Array.from(
      atob("iVBORw0KGgoAAAANSUhEUgAAAAIAAAABCAIAAAB7QOjdAAAAD0lEQVR4nGP8z8DAwMAAAAYIAQHLR3Z1AAAAAElFTkSuQmCC"),
      (c) => c.charCodeAt(0),
    );
    const file = await client.uploadFile(new Blob([png], { type: "image/png" }), "shot.png");
    expect(file).toMatchObject({ name: "shot.png", media_type: "image/png", size: png.length, width: 2, height: 1 });
    const { id } = await client.createSession({});
    const chat = new ChatSession({ client, sessionId: id });
    await chat.open();
    const sent = await chat.send("what is this?", { attachments: [{ file_id: file.id }] });
    expect(sent.attachments).toEqual([{ file_id: file.id, name: "shot.png", media_type: "image/png", size: png.length, width: 2, height: 1 }]);
    await until(() => chat.state.items.some((i) => i.kind === "turn_done"), 20_000);
    const answer = chat.state.items.find((i) => i.kind === "assistant");
    expect(answer && "content" in answer ? answer.content : "").toContain(`I received 1 file: shot.png (image/png, ${png.length} bytes, 2x1 pixels).`);
    chat.close();
  });

  it("stop() calls the cancel endpoint: the partial answer stays, marked interrupted", async () => {
    const client = new ParleyClient({ baseUrl: base, apiKey: KEY });
    const { id } = await client.createSession({});
    const chat = new ChatSession({ client, sessionId: id });
    await chat.open();
    await chat.send("[long] [slow] tell me a story"); // slow: the stop comes long before its end
    await until(() => chat.state.items.some((i) => i.kind === "assistant" && i.content.length > 40), 20_000);
    const result = await chat.stop();
    expect(result.cancelled).toBe(true);
    await until(() => chat.state.items.some((i) => i.kind === "turn_done"), 20_000);
    expect(chat.state.items.find((i) => i.kind === "assistant")).toMatchObject({ interrupted: true });
    expect(chat.state.status).toBe("idle");
    chat.close();
  });

  it("registerClientTool answers the model's call by itself; decide() approves with edited arguments", async () => {
    const client = new ParleyClient({ baseUrl: base, apiKey: KEY });
    const tool = { name: "get_browser_time", description: "The time here.", parameters: { type: "object" as const } };
    const { id } = await client.createSession({ client_tools: [tool], approval: ["calculate"] });
    const chat = new ChatSession({ client, sessionId: id });
    chat.registerClientTool(tool.name, tool, () => ({ time: "10:00" }));
    await chat.open();
    await chat.send("[call:get_browser_time {}] what is 2+3*4?");
    // one round: the client tool (answered by the session) and calculate (waiting for approval)
    await until(() => chat.state.approvals.length === 1, 20_000);
    await until(() => chat.state.clientTools.length === 0, 20_000);
    await chat.decide([{ tool_call_id: chat.state.approvals[0]!.toolCallId, decision: "edit", arguments: { expression: "6*7" } }]);
    await until(() => chat.state.items.some((i) => i.kind === "turn_done"), 20_000);
    const groups = chat.state.items.filter((i) => i.kind === "tool_group");
    expect(groups.map((g) => [g.toolName, g.result, g.decision])).toEqual([
      ["get_browser_time", '{"time": "10:00"}', null],
      ["calculate", "42", "edit"],
    ]);
    const { rows, lastEventId } = await client.history(id);
    await until(() => chat.state.lastSeq >= lastEventId);
    expect(transcript(chat.state)).toEqual(transcript(fromHistory(rows, lastEventId)));
    expect(transcript(chat.state).at(-1)).toContain("The result is 42.");
    chat.close();
  });

  it("a wrong key closes the stream with the 401 body instead of retrying forever", async () => {
    const { id } = await new ParleyClient({ baseUrl: base, apiKey: KEY }).createSession({});
    const stream = new SessionStream({ baseUrl: base, sessionId: id, apiKey: "wrong-key-wrong-key-00", onEvent: () => undefined });
    await stream.start();
    expect(stream.state.status).toBe("closed");
    const error = stream.state.error as ParleyHttpError;
    expect([error.status, error.code]).toEqual([401, "unauthorized"]);
    expect(error.body?.message).toContain("access_token");
    await expect(new ParleyClient({ baseUrl: base, apiKey: "nope-nope-nope-nope-1" }).models()).rejects.toMatchObject({ status: 401 });
  });

  it("another principal's session is a 404 that closes the stream", async () => {
    const stream = new SessionStream({ baseUrl: base, sessionId: "s_000000000000", apiKey: KEY, onEvent: () => undefined });
    await stream.start();
    expect(stream.state.error).toMatchObject({ status: 404 });
  });
});
