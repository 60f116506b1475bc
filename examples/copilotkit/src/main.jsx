import { CopilotKit, useCopilotAction } from "@copilotkit/react-core";
import { CopilotChat } from "@copilotkit/react-ui";
import "@copilotkit/react-ui/styles.css";
import { StrictMode } from "react";
import { createRoot } from "react-dom/client";

// One thread per browser tab, kept across reloads: CopilotKit sends it to the runtime as AG-UI's threadId,
// and Parley binds it to a session (docs/adapters.md, "Chats, threads and sessions").
const threadId = sessionStorage.getItem("parley.thread") ?? crypto.randomUUID();
sessionStorage.setItem("parley.thread", threadId);

// Parley's tools run on the server; CopilotChat shows a call only where a renderer is registered, so one
// renderer for every tool ("*"): its name, arguments and, when Parley has answered it, the result.
const ToolCalls = () => {
  useCopilotAction({
    name: "*",
    render: ({ name, args, status, result }) => (
      <div className="tool">
        {name}({JSON.stringify(args ?? {})}){status === "complete" ? ` → ${JSON.stringify(result)}` : " …"}
      </div>
    ),
  });
  return null;
};

const App = () => (
  <CopilotKit runtimeUrl="/api/copilotkit" agent="parley" threadId={threadId} showDevConsole={false}>
    <p className="bar">
      CopilotKit on Parley, thread <code>{threadId}</code>. <a href="/ui">Parley's page</a>
    </p>
    <ToolCalls />
    <CopilotChat labels={{ title: "Parley", initial: "Ask \"what time is it?\" or \"[long] a story\"." }} />
  </CopilotKit>
);

createRoot(document.getElementById("root")).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
