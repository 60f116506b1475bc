// The AI SDK's own client code against a live Parley: DefaultChatTransport posts and parses (validating
// every chunk with the package's uiMessageChunkSchema), readUIMessageStream builds the UIMessage.
// Usage: node scenarios/ai-sdk.mjs <package: ai | ai-v6 | ai-v5> <base url> <scenario> [chat id]
// Prints one JSON object: what the scenario observed (tests/kits/test_ai_sdk.py asserts on it).
const [pkg, base, scenario, givenChatId] = process.argv.slice(2);
const kit = await import(pkg);
const { DefaultChatTransport, readUIMessageStream } = kit;
const major = Number((await import(`${pkg}/package.json`, { with: { type: "json" } })).default.version.split(".")[0]);

const chatId = givenChatId ?? `chat-${scenario}-${Math.random().toString(36).slice(2)}`;
const transport = new DefaultChatTransport({ api: `${base}/v1/ai-sdk/chat?v=${major}`, body: bodyExtras() });

function bodyExtras() {
  if (scenario !== "client-tool") return undefined;
  return {
    client_tools: [
      { name: "get_location", description: "Where the user is.", parameters: { type: "object", properties: {} } },
    ],
  };
}

function userMessage(text) {
  return { id: `u-${Math.random().toString(36).slice(2)}`, role: "user", parts: [{ type: "text", text }] };
}

async function send(messages, abortSignal, messageId = undefined) {
  return transport.sendMessages({
    chatId, messages, trigger: "submit-message", messageId, abortSignal,
  });
}

// Every chunk the transport yields (already validated by the kit), and the message built from them.
async function collect(stream, message) {
  const chunks = [];
  const [forChunks, forMessage] = stream.tee();
  const reading = (async () => {
    const reader = forChunks.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      chunks.push(value);
    }
  })();
  let last;
  for await (const snapshot of readUIMessageStream({ stream: forMessage, message })) last = snapshot;
  await reading;
  return { chunks, message: last };
}

const types = (chunks) => chunks.map((c) => c.type);
const out = { major, chatId };

if (scenario === "text") {
  const user = userMessage("what time is it?");
  const { chunks, message } = await collect(await send([user]));
  out.types = types(chunks);
  out.finish = chunks.find((c) => c.type === "finish");
  out.message = message;
  out.history = await (await fetch(`${base}/v1/ai-sdk/chat/${chatId}/messages`)).json();
  out.idleResume = await transport.reconnectToStream({ chatId });
} else if (scenario === "client-tool") {
  const user = userMessage('[call:get_location {"precise": true}]');
  const first = await collect(await send([user]));
  out.firstTypes = types(first.chunks);
  out.firstFinish = first.chunks.find((c) => c.type === "finish");
  // The kit's browser-side tool flow: the app answers the call (addToolOutput) and sends again.
  const assistant = structuredClone(first.message);
  const part = assistant.parts.find((p) => p.type === "tool-get_location");
  out.call = { ...part };
  part.state = "output-available";
  part.output = { city: "Lisbon" };
  // As useChat sends it (sendAutomaticallyWhen, or sendMessage() with no message): the last message's id.
  const second = await collect(await send([user, assistant], undefined, assistant.id), assistant);
  out.secondTypes = types(second.chunks);
  out.message = second.message;
} else if (scenario === "stop") {
  const user = userMessage("[long] tell me everything");
  const stream = await send([user]);
  const reader = stream.getReader();
  const chunks = [];
  let cancelled = false;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    if (!cancelled && value.type === "text-delta") {
      const session = chunks.find((c) => c.type === "data-parley-session").data.sessionId;
      const answer = await fetch(`${base}/v1/sessions/${session}/cancel`, { method: "POST" });
      out.cancelStatus = answer.status;
      cancelled = true;
    }
  }
  out.types = types(chunks);
  out.last = chunks.at(-1);
} else if (scenario === "resume") {
  // A reload mid-answer: the first request is dropped after a few chunks (the turn goes on), then the
  // kit's resume replays the running turn from its start and follows it live.
  const user = userMessage("[slow] hello there");
  const controller = new AbortController();
  const stream = await send([user], controller.signal);
  const reader = stream.getReader();
  const before = [];
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    before.push(value);
    if (before.filter((c) => c.type === "text-delta").length >= 2) break;
  }
  controller.abort();
  out.before = types(before);
  const resumed = await transport.reconnectToStream({ chatId });
  const { chunks, message } = await collect(resumed);
  out.types = types(chunks);
  out.message = message;
  out.history = await (await fetch(`${base}/v1/ai-sdk/chat/${chatId}/messages`)).json();
  out.after = await transport.reconnectToStream({ chatId });
} else if (scenario === "approval") {
  // The kit's own Chat (what useChat wraps) on a session whose current_time call needs a person's
  // approval. From major 6 the kit's approval flow: the answer ends at the request, the app calls
  // addToolApprovalResponse and the kit sends again (sendAutomaticallyWhen), which continues the turn. A 5
  // client has no such flow: its stream stays open and the approval goes to Parley's own route.
  const answers = [];
  class RecordingTransport extends DefaultChatTransport {
    processResponseStream(stream) {
      const types = [];
      answers.push(types);
      return super.processResponseStream(stream).pipeThrough(
        new TransformStream({ transform(chunk, controller) { types.push(chunk.type); controller.enqueue(chunk); } }),
      );
    }
  }
  const posted = [];
  const transport = new RecordingTransport({
    api: `${base}/v1/ai-sdk/chat?v=${major}`,
    fetch: (url, init) => {
      if (init?.method === "POST") posted.push(JSON.parse(init.body));
      return fetch(url, init);
    },
  });
  class State {
    status = "ready";
    error = undefined;
    messages = [];
    pushMessage = (m) => { this.messages = this.messages.concat(m); };
    popMessage = () => { this.messages = this.messages.slice(0, -1); };
    replaceMessage = (i, m) => { this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)]; };
    snapshot = (thing) => structuredClone(thing);
  }
  class Chat extends kit.AbstractChat {}
  const errors = [];
  const chat = new Chat({
    id: chatId,
    transport,
    state: new State(),
    onError: (error) => errors.push(String(error)),
    onData: async (part) => {
      if (major < 6 && part.type === "data-parley-approval") {
        const answer = await fetch(`${base}/v1/sessions/${part.data.session_id}/approvals`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ decisions: [{ tool_call_id: part.data.tool_call_id, decision: "approve" }] }),
        });
        out.routeStatus = answer.status;
      }
    },
    sendAutomaticallyWhen: kit.lastAssistantMessageIsCompleteWithApprovalResponses,
  });
  await chat.sendMessage({ text: "what time is it?" });
  out.asked = structuredClone(chat.messages.at(-1).parts.find((p) => p.type === "tool-current_time"));
  out.statusAfterFirst = chat.status;
  if (major >= 6) {
    await chat.addToolApprovalResponse({ id: out.asked.approval.id, approved: true });
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline && !(answers.length === 2 && chat.status === "ready")) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
  out.answers = answers;
  out.errors = errors;
  out.continuation = posted.slice(1).map((body) => ({ trigger: body.trigger, messageId: body.messageId, last: body.messages.at(-1) }));
  out.message = chat.messages.at(-1);
  out.history = await (await fetch(`${base}/v1/ai-sdk/chat/${chatId}/messages`)).json();
} else {
  throw new Error(`unknown scenario ${scenario}`);
}
process.stdout.write(JSON.stringify(out));
