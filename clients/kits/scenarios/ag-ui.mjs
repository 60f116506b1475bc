// AG-UI's own client against a live Parley: @ag-ui/client's HttpAgent runs each request through the
// package's event verifier (verifyEvents) and applies the events to its messages.
// Usage: node scenarios/ag-ui.mjs <package> <base url> <scenario> [session id]
// <package>: @ag-ui/client (1.x), or ag-ui-v0 (0.0.59, what CopilotKit 1.7x ships; it sends no
// protocolVersion and validates RUN_FINISHED's outcome strictly).
// Prints one JSON object: what the scenario observed (tests/kits/test_kit_packages.py asserts on it).
const [pkg, base, scenario, sessionId] = process.argv.slice(2);
const { HttpAgent } = await import(pkg === "ag-ui-v0" ? "ag-ui-v0" : "@ag-ui/client");
const threadId = sessionId || `thread-${scenario}-${Math.random().toString(36).slice(2)}`;
const agent = new HttpAgent({
  url: `${base}/v1/ag-ui`,
  threadId,
  initialState: scenario === "context" ? { todos: [{ title: "call Ana", done: false }] } : undefined,
});
const out = { threadId };

async function run(options = {}) {
  const events = [];
  const result = await agent.runAgent(options, {
    onEvent: ({ event }) => {
      events.push(event);
    },
  });
  return { types: events.map((e) => e.type), events, result };
}

function user(text) {
  agent.addMessage({ id: `u-${Math.random().toString(36).slice(2)}`, role: "user", content: text });
}

const location = {
  name: "get_location",
  description: "Where the user is.",
  parameters: { type: "object", properties: {} },
};

if (scenario === "text") {
  user("what time is it?");
  const first = await run();
  out.types = first.types;
  out.messages = agent.messages;
  // Another client attaching to the same thread: a run without new input gets the history as a snapshot.
  const other = new HttpAgent({ url: `${base}/v1/ag-ui`, threadId });
  const events = [];
  await other.runAgent({}, { onEvent: ({ event }) => { events.push(event); } });
  out.attachTypes = events.map((e) => e.type);
  out.attachMessages = other.messages;
} else if (scenario === "frontend-tool") {
  user('[call:get_location {"precise": true}]');
  const first = await run({ tools: [location] });
  out.firstTypes = first.types;
  out.finished = first.events.find((e) => e.type === "RUN_FINISHED");
  const call = agent.messages.at(-1).toolCalls?.[0];
  out.call = call;
  // The frontend ran the tool: its result goes in as a tool message, and the next run continues.
  agent.addMessage({ id: `r-${call.id}`, role: "tool", toolCallId: call.id, content: '{"city": "Lisbon"}' });
  const second = await run({ tools: [location] });
  out.secondTypes = second.types;
  out.messages = agent.messages;
} else if (scenario === "approval") {
  user("what time is it?");
  const first = await run();
  out.firstTypes = first.types;
  out.finished = first.events.find((e) => e.type === "RUN_FINISHED");
  const interrupt = out.finished.outcome.interrupts[0];
  const second = await run({
    resume: [{ interruptId: interrupt.id, status: "resolved", payload: { decision: "approve" } }],
  });
  out.secondTypes = second.types;
  out.messages = agent.messages;
} else if (scenario === "context") {
  // What a CopilotKit page sends besides its messages: readables as context, shared state, properties.
  user("what is left to do?");
  const first = await run({
    context: [{ description: "The user's todo list", value: JSON.stringify([{ title: "call Ana" }]) }],
    forwardedProps: { parley: { delivery: "queue" }, somethingOfTheFramework: 1 },
  });
  out.types = first.types;
  out.snapshot = first.events.find((e) => e.type === "STATE_SNAPSHOT")?.snapshot ?? null;
  out.state = agent.state;
  out.messages = agent.messages;
} else {
  throw new Error(`unknown scenario ${scenario}`);
}
process.stdout.write(JSON.stringify(out));
