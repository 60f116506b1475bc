// One chat session as a page uses it: the history, then the stream from the position the history read
// includes, every event through the pure reducer; send (optimistic), stop, approvals and client tools.
import type { ParleyClient } from "./client";
import { ParleyHttpError } from "./errors";
import {
  addOptimistic,
  emptyState,
  failOptimistic,
  fromHistory,
  fromPending,
  fromTurns,
  reduce,
  type ChatState,
} from "./reduce";
import { SessionStream, type ConnectionState } from "./stream";
import type {
  ActivePath,
  ApprovalDecision,
  BranchTurn,
  ClientToolDeclaration,
  EditRequest,
  MessageAccepted,
  MessageCreate,
  ParleyEvent,
  RegenerateRequest,
  Session,
} from "./types";

export type ClientToolHandler = (args: unknown) => unknown | Promise<unknown>;

export interface ChatSessionOptions {
  client: ParleyClient;
  sessionId: string;
  /** Called after every change of `state` or `connection`. */
  onChange?: (session: ChatSession) => void;
  onEvent?: (event: ParleyEvent) => void;
  stream?: Partial<Pick<ConstructorParameters<typeof SessionStream>[0], "initialDelayMs" | "maxDelayMs" | "maxAttempts" | "random">>;
}

function newId(): string {
  return globalThis.crypto?.randomUUID?.() ?? `c-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

export class ChatSession {
  readonly client: ParleyClient;
  readonly sessionId: string;
  state: ChatState = emptyState();
  /** The session as GET /v1/sessions/{id} last answered (title, model, totals). */
  session: Session | null = null;
  connection: ConnectionState = { status: "connecting", attempt: 0, error: null, retryInMs: null };
  private readonly options: ChatSessionOptions;
  private stream: SessionStream | null = null;
  private readonly tools = new Map<string, { declaration: ClientToolDeclaration; handler: ClientToolHandler }>();
  private readonly answered = new Set<string>();
  /** While the history is read again after a branch_changed: the events that came meanwhile, applied
   * after it (those it already includes are dropped by their seq). */
  private buffered: ParleyEvent[] | null = null;

  constructor(options: ChatSessionOptions) {
    this.options = options;
    this.client = options.client;
    this.sessionId = options.sessionId;
  }

  private changed(): void {
    this.options.onChange?.(this);
  }

  /** Loads the history, then follows the stream from the position it includes. */
  async open(): Promise<void> {
    try {
      await this.reload();
    } catch (error) {
      // A refused history read (401, 404) is the connection's state too: the page shows why.
      const reason = error instanceof Error ? error : new Error(String(error));
      this.connection = { status: "closed", attempt: 0, error: reason, retryInMs: null };
      this.changed();
      throw error;
    }
    this.stream = new SessionStream({
      baseUrl: this.client.baseUrl,
      apiKey: this.client.apiKey,
      ...(this.client.renewsCredential ? { credential: (refresh: boolean) => this.client.credential(refresh) } : {}),
      fetch: this.client.fetchImpl,
      sessionId: this.sessionId,
      after: this.state.lastSeq,
      ...this.options.stream,
      onEvent: (event) => this.apply(event),
      onResync: () => this.reload(),
      onState: (connection) => {
        this.connection = connection;
        this.changed();
      },
    });
    void this.stream.start();
  }

  /** Reads the session, its whole history and what waits for an answer again (at open, and on `resync`):
   * the approval and client tool requests of a suspended turn are older than the history's position, so
   * the stream will not send them again. */
  async reload(): Promise<void> {
    const [session, { rows, lastEventId }, { turns }] = await Promise.all([
      this.client.getSession(this.sessionId),
      this.client.history(this.sessionId),
      this.client.turns(this.sessionId),
    ]);
    // After the history: a request answered since is answered again on the stream (after its position),
    // one made since comes twice (the reducer keeps one per tool_call_id); neither is lost.
    const { pending } = await this.client.pending(this.sessionId);
    this.session = session;
    this.state = fromTurns(fromPending(fromHistory(rows, lastEventId, this.state), pending), turns);
    for (const request of this.state.clientTools) void this.runClientTool(request.toolCallId, request.name, request.arguments);
    // The usage header before the next token_usage event: the session's stored totals.
    if (this.state.usage === null && session.total_tokens > 0) {
      const window = session.context_window;
      this.state = {
        ...this.state,
        usage: {
          context_used: session.context_used,
          context_window: window,
          context_percent: window ? Math.round((session.context_used / window) * 1000) / 10 : null,
          session_total_tokens: session.total_tokens,
          model: session.model,
          estimated: false,
          cache_read_tokens: 0,
          cache_write_tokens: 0,
        },
      };
    }
    this.changed();
  }

  private apply(event: ParleyEvent): void {
    if (this.buffered !== null && event.type !== "resync") {
      this.buffered.push(event);
      return;
    }
    // After a reload the history may already include events the stream still sends.
    if (event.type !== "resync" && event.seq <= this.state.lastSeq) return;
    this.state = reduce(this.state, event);
    this.options.onEvent?.(event);
    if (event.type === "client_tool_requested") void this.runClientTool(event.tool_call_id, event.name, event.arguments);
    // Another path is active (here or in another tab): its history and siblings are read again.
    if (event.type === "branch_changed") void this.followBranch();
    this.changed();
  }

  private async followBranch(): Promise<void> {
    this.buffered = [];
    try {
      await this.reload();
    } catch {
      // The stream goes on; the next branch_changed or resync reads the history again.
    } finally {
      const events = this.buffered;
      this.buffered = null;
      for (const event of events) this.apply(event);
    }
  }

  close(): void {
    this.stream?.close();
  }

  /** Skip the backoff's wait (e.g. the page became visible again). */
  reconnectNow(): void {
    this.stream?.reconnectNow();
  }

  /** Sends a message, shown at once; its client_message_id doubles as the Idempotency-Key of retries. */
  async send(content: string, options: Partial<Omit<MessageCreate, "content" | "client_message_id">> = {}): Promise<MessageAccepted> {
    const clientMessageId = newId();
    this.state = addOptimistic(this.state, { clientMessageId, content, timestamp: new Date().toISOString(), error: null });
    this.changed();
    try {
      return await this.client.postMessage(
        this.sessionId,
        { ...options, content, client_message_id: clientMessageId },
        clientMessageId,
      );
    } catch (error) {
      this.state = failOptimistic(this.state, clientMessageId, error instanceof Error ? error.message : String(error));
      this.changed();
      throw error;
    }
  }

  /** Stop: the cancel endpoint ends the turn on the server; the stream stays open and shows the stop. */
  stop(clearQueue = false): ReturnType<ParleyClient["cancel"]> {
    return this.client.cancel(this.sessionId, clearQueue);
  }

  /** One answer for several requests: the server wants every open approval of a round decided at once. */
  decide(decisions: ApprovalDecision[]): Promise<unknown> {
    return this.client.decide(this.sessionId, decisions);
  }

  approve(toolCallId: string): Promise<unknown> {
    return this.client.decide(this.sessionId, [{ tool_call_id: toolCallId, decision: "approve" }]);
  }

  reject(toolCallId: string, reason?: string): Promise<unknown> {
    return this.client.decide(this.sessionId, [
      { tool_call_id: toolCallId, decision: "reject", ...(reason ? { reason } : {}) },
    ]);
  }

  edit(toolCallId: string, args: unknown): Promise<unknown> {
    return this.client.decide(this.sessionId, [{ tool_call_id: toolCallId, decision: "edit", arguments: args }]);
  }

  /** Answers the turn's user input again; the new turn heads the active path (branch_changed follows). */
  regenerate(turnId: string, options: Partial<RegenerateRequest> = {}): Promise<BranchTurn> {
    return this.client.regenerate(this.sessionId, turnId, options, newId());
  }

  /** Sends `content` as an edit of the turn's user message, in a new turn beside it. (`edit` edits a tool
   * call's arguments for an approval.) */
  editMessage(turnId: string, content: string, options: Partial<Omit<EditRequest, "content">> = {}): Promise<BranchTurn> {
    return this.client.edit(this.sessionId, turnId, { ...options, content }, newId());
  }

  /** Switches the active path to the one through the turn (a "< i/n >" arrow). */
  activate(turnId: string): Promise<ActivePath> {
    return this.client.activate(this.sessionId, turnId);
  }

  /** A new session with this one's history up to and including the turn. */
  fork(turnId: string): Promise<Session> {
    return this.client.fork(this.sessionId, turnId, newId());
  }

  /** A tool this page runs: declare `clientTools()` when creating the session; requests are answered here. */
  registerClientTool(name: string, schema: Omit<ClientToolDeclaration, "name">, handler: ClientToolHandler): void {
    this.tools.set(name, { declaration: { name, ...schema }, handler });
    for (const request of this.state.clientTools) void this.runClientTool(request.toolCallId, request.name, request.arguments);
  }

  clientTools(): ClientToolDeclaration[] {
    return [...this.tools.values()].map((t) => t.declaration);
  }

  private async runClientTool(toolCallId: string, name: string, args: unknown): Promise<void> {
    const tool = this.tools.get(name);
    if (!tool || this.answered.has(toolCallId)) return; // another tab or program may answer it
    this.answered.add(toolCallId);
    let result;
    try {
      result = { tool_call_id: toolCallId, output: await tool.handler(args) };
    } catch (error) {
      result = { tool_call_id: toolCallId, error: error instanceof Error ? error.message : String(error) };
    }
    try {
      await this.client.toolResults(this.sessionId, [result]);
    } catch (error) {
      // 409/410: answered elsewhere or expired; the stream's client_tool_resolved tells the outcome.
      if (!(error instanceof ParleyHttpError) || error.retryable) this.answered.delete(toolCallId);
    }
  }
}
