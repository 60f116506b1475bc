// Compiled (never run) by `tsc --noEmit`: shows, and proves, how a client uses the generated types.
import type { components, paths } from "./parley";

type Schemas = components["schemas"];
export type Event = Schemas["Event"];
export type Turn =
  paths["/v1/sessions/{session_id}/turns/{turn_id}"]["get"]["responses"][200]["content"]["application/json"];

// One SSE frame's `data:`: the union narrows on `type`.
export function describe(event: Event): string {
  switch (event.type) {
    case "text_delta":
      return event.timestamp === undefined ? event.text : `${event.model ?? "?"}: ${event.text}`;
    case "tool_exec_start":
      return `${event.tool_call.name}(${JSON.stringify(event.tool_call.arguments)})`;
    case "tool_exec_end":
      return `${event.tool_result.is_error ? "error" : "ok"} after ${event.duration_ms} ms`;
    case "token_usage":
      return event.context_percent === null ? `${event.context_used} tokens` : `${event.context_percent}%`;
    case "turn_done":
      return `${event.turn_id} ${event.status} in ${event.duration_seconds} s`;
    default:
      return `#${event.seq} ${event.type}`;
  }
}

// The stream as NDJSON (`Accept: application/x-ndjson`): each non-blank line is one Event.
type StreamContent = paths["/v1/sessions/{session_id}/events"]["get"]["responses"][200]["content"];
export function parseLine(line: string): StreamContent["application/x-ndjson"] | null {
  return line.trim() === "" ? null : (JSON.parse(line) as StreamContent["application/x-ndjson"]);
}

// POST .../messages?wait=true answers 200 with the ended turn, in the turn view's shape.
export type WaitedTurn =
  paths["/v1/sessions/{session_id}/messages"]["post"]["responses"][200]["content"]["application/json"];
export const asTurn = (waited: WaitedTurn): Turn => waited;

// The turn view: nodes narrow on `kind`.
export function transcript(turn: Turn): string[] {
  const lines = turn.user_messages.map((m) => `${m.sender}: ${m.content}`);
  for (const node of turn.nodes) {
    if (node.kind === "reasoning") lines.push(`(thinking) ${node.content}`);
    else lines.push(node.kind === "llm" ? node.content : `${node.tool_name} -> ${node.result ?? "…"}`);
  }
  if (turn.status !== "running" && turn.final_answer !== null) lines.push(turn.final_answer);
  return lines;
}

// A request body and an error body, as the REST routes take and give them.
export const create: Schemas["SessionCreate"] = { title: "demo", tools: ["current_time"] };
export function failure(body: Schemas["ErrorResponse"]): string {
  return `${body.error.code}: ${body.error.message}`;
}
