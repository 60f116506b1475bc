// A plain Node script with the client: `npm run example -- "what time is it?"` (PARLEY_URL, PARLEY_KEY).
import { ChatSession, ParleyClient } from "../src/index";

const client = new ParleyClient({ baseUrl: process.env.PARLEY_URL ?? "http://127.0.0.1:8000", apiKey: process.env.PARLEY_KEY });
const { id } = await client.createSession({});
const chat = new ChatSession({
  client,
  sessionId: id,
  onEvent: (e) => {
    if (e.type === "text_delta") process.stdout.write(e.text);
    if (e.type === "tool_exec_end") process.stdout.write(`\n[${e.tool_result.content}, ${e.duration_ms} ms]\n`);
    if (e.type === "turn_done") {
      console.log(`\n(${e.status} in ${e.duration_seconds} s; session ${id})`);
      chat.close();
    }
  },
});
await chat.open();
await chat.send(process.argv[2] ?? "what time is it?");
