// One chat through the page's own code (src/parley.js), from Node, against a live Parley:
//   node scripts/chat.mjs http://127.0.0.1:8000 ["what time is it?"]
// Prints one JSON object: the session, the AG-UI event types, the messages, and what an attach from a
// second agent on the same thread (a reloaded page) got.
import { attach, parleyAgent, send, sessionOf } from "../src/parley.js";

const [base = "http://127.0.0.1:8000", text = "what time is it?"] = process.argv.slice(2);
const threadId = `example-${crypto.randomUUID()}`;
const agent = parleyAgent({ base, threadId });
const types = [];
let sessionId = null;
await send(agent, text, {
  context: [{ description: "The page the user is on", value: "the Parley example" }],
  onEvent: (event) => {
    types.push(event.type);
    sessionId ??= sessionOf(event);
  },
});
const reloaded = parleyAgent({ base, threadId });
await attach(reloaded);
process.stdout.write(
  JSON.stringify({ threadId, sessionId, types, messages: agent.messages, reloaded: reloaded.messages }),
);
