// CopilotKit's runtime on Parley: one AG-UI agent, "parley", an HttpAgent on Parley's POST /v1/ag-ui.
// PARLEY_URL (default http://127.0.0.1:8000), PARLEY_API_KEY (optional, sent as a bearer token: the key
// stays on this server, never in the page), PORT (default 4000). The page reaches it at /api/copilotkit.
import http from "node:http";

// CopilotKit's telemetry is on unless this says no; set before its modules load (static imports run first).
process.env.COPILOTKIT_TELEMETRY_DISABLED ??= "true";
const { HttpAgent } = await import("@ag-ui/client");
const { CopilotRuntime } = await import("@copilotkit/runtime/v2");
const { createCopilotNodeListener } = await import("@copilotkit/runtime/v2/node");

const parley = (process.env.PARLEY_URL ?? "http://127.0.0.1:8000").replace(/\/$/, "");
const key = process.env.PARLEY_API_KEY;
const headers = key ? { Authorization: `Bearer ${key}` } : {};
const port = Number(process.env.PORT ?? 4000);

const runtime = new CopilotRuntime({ agents: { parley: new HttpAgent({ url: `${parley}/v1/ag-ui`, headers }) } });
const listener = createCopilotNodeListener({ runtime, basePath: "/api/copilotkit", activateChannels: false });

http.createServer(listener).listen(port, "127.0.0.1", () => {
  console.log(`CopilotKit runtime on http://127.0.0.1:${port}/api/copilotkit, agent "parley" on ${parley}/v1/ag-ui`);
});
