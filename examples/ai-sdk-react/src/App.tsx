import { useChat } from "@ai-sdk/react";
import {
  DefaultChatTransport,
  getToolName,
  isToolUIPart,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  type UIMessage,
} from "ai";
import { type FormEvent, useEffect, useMemo, useState } from "react";
import { authHeaders, cancelTurn, CHAT_API, chatIdFromUrl, loadMessages, PARLEY } from "./parley";

export function App() {
  const chatId = useMemo(chatIdFromUrl, []);
  const [history, setHistory] = useState<UIMessage[] | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  useEffect(() => {
    loadMessages(chatId).then(setHistory, (error: unknown) => setFailure(String(error)));
  }, [chatId]);
  if (failure) return <p className="error">{failure}</p>;
  // useChat takes its first messages once: mount it when the history is in.
  return history ? <Chat chatId={chatId} history={history} /> : <p id="loading">Loading…</p>;
}

function Chat({ chatId, history }: { chatId: string; history: UIMessage[] }) {
  const [sessionId, setSessionId] = useState<string | null>(null);
  const transport = useMemo(
    () =>
      new DefaultChatTransport({
        api: CHAT_API, // resume: GET {api}/{chatId}/stream, the transport's default
        headers: authHeaders,
        // Parley keeps the history and reads only the last message: send just that one.
        prepareSendMessagesRequest: ({ id, messages, trigger, messageId }) => ({
          body: { id, messages: messages.slice(-1), trigger, messageId },
        }),
      }),
    [],
  );
  const { messages, sendMessage, regenerate, addToolApprovalResponse, status, error } = useChat({
    id: chatId,
    messages: history,
    resume: true, // on mount: GET .../stream replays a turn still running (after a reload) and follows it
    transport,
    onData: (part) => {
      // Parley's extras arrive as transient data parts, never stored in the message.
      if (part.type === "data-parley-session") setSessionId((part.data as { sessionId: string }).sessionId);
    },
    // A call that needs a person's approval (a session created with `approval`) ends the answer; the
    // response goes back with the next request, which continues the same turn.
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  });
  const respond = (id: string, approved: boolean) => void addToolApprovalResponse({ id, approved });
  const busy = status === "submitted" || status === "streaming";

  function onSubmit(event: FormEvent<HTMLFormElement>) {
    event.preventDefault();
    const input = event.currentTarget.elements.namedItem("input") as HTMLInputElement;
    if (!input.value.trim()) return;
    void sendMessage({ text: input.value });
    input.value = "";
  }

  return (
    <main>
      <header>
        <h1>useChat on Parley</h1>
        <span>
          chat <code id="chat-id">{chatId}</code>
          {sessionId && (
            <>
              {" · "}
              <a id="session-link" href={`${PARLEY}/ui#${sessionId}`} data-session-id={sessionId}>
                {sessionId} on Parley's page
              </a>
            </>
          )}
          {" · "}
          <a href="?">new chat</a>
        </span>
      </header>
      <ol id="messages">
        {messages.map((message) => (
          <li key={message.id} className={`message ${message.role}`} data-role={message.role} data-id={message.id}>
            {message.parts.map((part, index) => (
              <Part key={index} part={part} respond={respond} />
            ))}
          </li>
        ))}
      </ol>
      {error && <p className="error">{error.message}</p>}
      <form onSubmit={onSubmit}>
        <input id="input" name="input" autoComplete="off" placeholder="Ask the demo model: what time is it?" />
        <button id="send" type="submit" disabled={busy}>
          Send
        </button>
        <button id="stop" type="button" disabled={!busy || !sessionId} onClick={() => sessionId && cancelTurn(sessionId)}>
          Stop
        </button>
        <button
          id="regenerate"
          type="button"
          disabled={busy || messages.at(-1)?.role !== "assistant"}
          onClick={() => void regenerate()}
        >
          Regenerate
        </button>
        <span id="status" data-status={status}>
          {status}
        </span>
      </form>
    </main>
  );
}

type Respond = (approvalId: string, approved: boolean) => void;

function Part({ part, respond }: { part: UIMessage["parts"][number]; respond: Respond }) {
  if (part.type === "text") return <p className="text">{part.text}</p>;
  if (part.type === "reasoning") return <p className="reasoning">{part.text}</p>;
  if (isToolUIPart(part)) {
    return (
      <div className="tool" data-tool={getToolName(part)} data-state={part.state}>
        <b className="tool-name">{getToolName(part)}</b>
        <code className="tool-input">{JSON.stringify(part.input)}</code>
        {part.state === "output-available" && <pre className="tool-output">{show(part.output)}</pre>}
        {part.state === "output-error" && <pre className="tool-output error">{part.errorText}</pre>}
        {part.state === "approval-requested" && (
          <span className="approval">
            <button className="approve" onClick={() => respond(part.approval.id, true)}>
              Approve
            </button>
            <button className="deny" onClick={() => respond(part.approval.id, false)}>
              Deny
            </button>
          </span>
        )}
      </div>
    );
  }
  if (part.type === "file") return <p className="file">📎 {part.filename ?? part.mediaType}</p>;
  if (part.type === "data-parley-error") return <p className="error">{(part.data as { message: string }).message}</p>;
  return null; // step-start and the rest
}

function show(value: unknown): string {
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}
