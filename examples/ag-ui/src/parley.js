// What the page does with Parley, without React: an AG-UI HttpAgent on a Parley thread, a run per user
// message, the thread attached again after a reload. scripts/chat.mjs drives the same code from Node
// (tests/kits/test_ag_ui_example.py runs it against a live Parley).
import { HttpAgent } from "@ag-ui/client";

// base: "" in the page (vite's dev and preview servers proxy /v1 to Parley), a full URL from Node.
export function parleyAgent({ base = "", threadId, headers = {} }) {
  return new HttpAgent({ url: `${base}/v1/ag-ui`, threadId, headers });
}

// The session behind the thread: Parley names it in a CUSTOM event of every run that follows a turn.
export function sessionOf(event) {
  return event.type === "CUSTOM" && event.name === "parley.session" ? event.value.sessionId : null;
}

// One user message and the run that answers it. `context`: CopilotKit's readables ({description,
// value}), for the model in this turn only; `onEvent` sees every AG-UI event, `onChange` the messages.
export async function send(agent, text, { context = [], onEvent = () => {}, onChange = () => {} } = {}) {
  agent.addMessage({ id: crypto.randomUUID(), role: "user", content: text });
  onChange(agent.messages);
  return run(agent, { context }, { onEvent, onChange });
}

// A run without new input: Parley's history of the thread (MESSAGES_SNAPSHOT), then the turn that is
// running, if any, replayed from its start. What a page does when it loads.
export async function attach(agent, { onEvent = () => {}, onChange = () => {} } = {}) {
  return run(agent, {}, { onEvent, onChange });
}

async function run(agent, parameters, { onEvent, onChange }) {
  return agent.runAgent(parameters, {
    onEvent: ({ event }) => onEvent(event),
    onMessagesChanged: ({ messages }) => onChange(messages),
  });
}
