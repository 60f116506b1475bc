// A chat page on Parley over AG-UI: the thread survives a reload (its id is kept in localStorage, and the
// page attaches to it on load: the history, then the running answer), tool calls show with their
// results, and the todo list below reaches the model as AG-UI context (CopilotKit's useCopilotReadable).
import React, { useEffect, useMemo, useRef, useState } from "react";
import { createRoot } from "react-dom/client";
import { attach, parleyAgent, send, sessionOf } from "./parley.js";

function threadId(fresh = false) {
  let id = localStorage.getItem("parley-thread");
  if (fresh || !id) {
    id = `page-${crypto.randomUUID()}`;
    localStorage.setItem("parley-thread", id);
  }
  return id;
}

function Chat({ thread, onNew }) {
  const agent = useMemo(() => parleyAgent({ threadId: thread }), [thread]);
  const [messages, setMessages] = useState([]);
  const [busy, setBusy] = useState(true);
  // Named by the runs that follow a turn; kept, so that a reload after the answer still links to it.
  const [session, setSession] = useState(() => localStorage.getItem(`parley-session:${thread}`));
  const [error, setError] = useState(null);
  const [todos, setTodos] = useState("call Ana\nbook the train to Porto");
  const input = useRef(null);
  const handlers = {
    onChange: (m) => setMessages([...m]),
    onEvent: (e) => {
      const id = sessionOf(e);
      if (id) {
        localStorage.setItem(`parley-session:${thread}`, id);
        setSession(id);
      }
    },
  };

  async function running(promise) {
    setBusy(true);
    setError(null);
    try {
      await promise;
    } catch (e) {
      setError(String(e?.message ?? e));
    } finally {
      setBusy(false);
    }
  }

  useEffect(() => {
    running(attach(agent, handlers));
  }, [agent]);

  function submit(e) {
    e.preventDefault();
    const text = input.current.value.trim();
    if (!text) return;
    input.current.value = "";
    const context = [{ description: "The user's todo list, one a line", value: todos }];
    running(send(agent, text, { ...handlers, context }));
  }

  const results = Object.fromEntries(
    messages.filter((m) => m.role === "tool").map((m) => [m.toolCallId, m.content]),
  );
  return (
    <>
      <h1>Parley over AG-UI</h1>
      <p className="bar">
        thread {thread}
        {session && (
          <>
            {" "}· session <a href={`/ui#${session}`}>{session}</a> (Parley's own page)
          </>
        )}{" "}
        · <button type="button" onClick={onNew}>new chat</button>
      </p>
      {messages
        .filter((m) => m.role === "user" || m.role === "assistant")
        .map((m) => (
          <div key={m.id} className={`msg ${m.role}`}>
            {m.content}
            {(m.toolCalls ?? []).map((c) => (
              <div key={c.id} className="tool">
                {c.function.name}({c.function.arguments}){c.id in results ? ` → ${results[c.id]}` : " …"}
              </div>
            ))}
          </div>
        ))}
      {error && <p role="alert">{error}</p>}
      <form onSubmit={submit}>
        <input ref={input} placeholder="what time is it?  ·  what is 2+3*4?" disabled={busy} />
        <button disabled={busy}>send</button>
      </form>
      <p className="bar">The model sees this list with your next message (AG-UI context), not in the history:</p>
      <textarea rows={3} value={todos} onChange={(e) => setTodos(e.target.value)} />
    </>
  );
}

function App() {
  const [thread, setThread] = useState(() => threadId());
  return <Chat key={thread} thread={thread} onNew={() => setThread(threadId(true))} />;
}

createRoot(document.getElementById("root")).render(<App />);
