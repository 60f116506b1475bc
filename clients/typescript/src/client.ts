// The REST side: one small fetch wrapper per route, each answering the route's typed body or throwing a
// ParleyHttpError with the service's error JSON.
import { httpError } from "./errors";
import type {
  ActivateRequest,
  ActivePath,
  ApprovalDecision,
  BranchTurn,
  CancelResult,
  ClientToolResult,
  EditRequest,
  FileOut,
  HistoryPage,
  HistoryRow,
  MessageAccepted,
  MessageCreate,
  ModelList,
  PendingList,
  RegenerateRequest,
  Session,
  SessionCreate,
  SessionPage,
  StreamToken,
  ToolList,
  TurnPage,
} from "./types";

/**
 * Gives the bearer token (a JWT of your identity provider, or of your backend): called before the first
 * request, again with `refresh: true` when the server refused the token (401) or it expires within
 * TOKEN_REFRESH_MARGIN_MS, so a short-lived token is renewed without the caller noticing.
 */
export type TokenProvider = (refresh: boolean) => string | null | Promise<string | null>;

/** A token this close to its `exp` is asked for again before it is sent. */
export const TOKEN_REFRESH_MARGIN_MS = 30_000;

export interface ClientOptions {
  /** The service's origin, e.g. http://127.0.0.1:8000 ("" in a page the service serves). */
  baseUrl: string;
  /** A bearer key; none when the server runs without keys. */
  apiKey?: string | null;
  /** A bearer token's source, instead of a fixed key (docs/auth.md). */
  token?: TokenProvider;
  fetch?: typeof fetch;
}

/** Milliseconds since the epoch at which a JWT's `exp` passes; null for anything else (a key). */
export function tokenExpiry(token: string): number | null {
  const parts = token.split(".");
  const payload = parts[1];
  if (parts.length !== 3 || payload === undefined) return null;
  try {
    const json = atob(payload.replace(/-/g, "+").replace(/_/g, "/"));
    const exp = (JSON.parse(json) as { exp?: unknown }).exp;
    return typeof exp === "number" ? exp * 1000 : null;
  } catch {
    return null;
  }
}

export class ParleyClient {
  readonly baseUrl: string;
  readonly apiKey: string | null;
  readonly fetchImpl: typeof fetch;
  private readonly tokenProvider: TokenProvider | null;
  private token: string | null = null;

  constructor(options: ClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/$/, "");
    this.apiKey = options.apiKey ?? null;
    this.tokenProvider = options.token ?? null;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** Whether a refused credential is worth asking for again (a token source, not a fixed key). */
  get renewsCredential(): boolean {
    return this.tokenProvider !== null;
  }

  /**
   * The bearer credential to send: the key, or the token source's token (asked again when `refresh`, or
   * when the one it gave expires within TOKEN_REFRESH_MARGIN_MS).
   */
  async credential(refresh = false): Promise<string | null> {
    if (this.tokenProvider === null) return this.apiKey;
    const expiry = this.token === null ? null : tokenExpiry(this.token);
    const expiring = expiry !== null && expiry - Date.now() < TOKEN_REFRESH_MARGIN_MS;
    if (refresh || this.token === null || expiring) this.token = await this.tokenProvider(refresh || expiring);
    return this.token;
  }

  async request<T>(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<T> {
    let response = await this.send(method, path, body, headers, await this.credential());
    if (response.status === 401 && this.tokenProvider !== null) {
      // Expired or revoked: one more try with a token asked for anew.
      response = await this.send(method, path, body, headers, await this.credential(true));
    }
    if (!response.ok) throw await httpError(response);
    return (await response.json()) as T;
  }

  private send(
    method: string,
    path: string,
    body: unknown,
    headers: Record<string, string>,
    credential: string | null,
  ): Promise<Response> {
    const all: Record<string, string> = { accept: "application/json", ...headers };
    if (credential) all.authorization = `Bearer ${credential}`;
    if (body !== undefined) all["content-type"] = "application/json";
    return this.fetchImpl(`${this.baseUrl}${path}`, {
      method,
      headers: all,
      body: body === undefined ? null : JSON.stringify(body),
    });
  }

  private session(sessionId: string): string {
    return `/v1/sessions/${encodeURIComponent(sessionId)}`;
  }

  /** GET /v1/tools: every server tool a session may choose, with its JSON schema. */
  tools(): Promise<ToolList> {
    return this.request("GET", "/v1/tools");
  }

  models(): Promise<ModelList> {
    return this.request("GET", "/v1/models");
  }

  listSessions(limit = 50, cursor?: string): Promise<SessionPage> {
    const query = new URLSearchParams({ limit: String(limit) });
    if (cursor) query.set("cursor", cursor);
    return this.request("GET", `/v1/sessions?${query}`);
  }

  createSession(body: SessionCreate = {}, idempotencyKey?: string): Promise<Session> {
    return this.request("POST", "/v1/sessions", body, idempotencyKey ? { "idempotency-key": idempotencyKey } : {});
  }

  /** A short-lived token for a browser's EventSource: `events?access_token=<token>` (docs/auth.md). */
  streamToken(sessionId: string): Promise<StreamToken> {
    return this.request("POST", `${this.session(sessionId)}/stream_token`);
  }

  getSession(sessionId: string): Promise<Session> {
    return this.request("GET", this.session(sessionId));
  }

  deleteSession(sessionId: string): Promise<unknown> {
    return this.request("DELETE", this.session(sessionId));
  }

  /** One page of the history, in order, with the stream position it includes. */
  historyPage(sessionId: string, after?: string | null, limit = 500): Promise<HistoryPage> {
    const query = new URLSearchParams({ limit: String(limit) });
    if (after) query.set("after", after);
    return this.request("GET", `${this.session(sessionId)}/messages?${query}`);
  }

  /** The whole history, and the position of the newest read (subscribe after it). */
  async history(sessionId: string): Promise<{ rows: HistoryRow[]; lastEventId: number }> {
    const rows: HistoryRow[] = [];
    let cursor: string | null = null;
    let lastEventId = 0;
    do {
      const page: HistoryPage = await this.historyPage(sessionId, cursor);
      rows.push(...page.chat_messages);
      lastEventId = page.last_event_id;
      cursor = page.next_cursor;
    } while (cursor);
    return { rows, lastEventId };
  }

  /**
   * POST /v1/files: uploads a file (multipart) for `attachments: [{file_id}]`; its type is read from its bytes.
   * `onProgress(sent, total)` hears the body's bytes as they leave: fetch reports none, so in a browser the
   * upload then goes through XMLHttpRequest, whose upload progress events say it; elsewhere (Node) it is
   * called once, when the body is sent.
   */
  async uploadFile(file: Blob, name = "file", options: UploadOptions = {}): Promise<FileOut> {
    const form = new FormData();
    form.append("file", file, file instanceof File ? file.name : name);
    const url = `${this.baseUrl}/v1/files`;
    const { onProgress } = options;
    const post = (credential: string | null): Promise<Response> => {
      const headers: Record<string, string> = { accept: "application/json" };
      if (credential) headers.authorization = `Bearer ${credential}`;
      return onProgress && typeof XMLHttpRequest !== "undefined"
        ? xhrPost(url, headers, form, onProgress)
        : this.fetchImpl(url, { method: "POST", headers, body: form });
    };
    let response = await post(await this.credential());
    if (response.status === 401 && this.tokenProvider !== null) response = await post(await this.credential(true));
    if (!response.ok) throw await httpError(response);
    if (onProgress && typeof XMLHttpRequest === "undefined") onProgress(file.size, file.size);
    return (await response.json()) as FileOut;
  }

  /** GET /v1/files/{file_id}/content: the file's bytes (e.g. for a thumbnail's object URL). */
  async fileContent(fileId: string): Promise<Blob> {
    const url = `${this.baseUrl}/v1/files/${encodeURIComponent(fileId)}/content`;
    const get = (credential: string | null): Promise<Response> =>
      this.fetchImpl(url, { headers: credential ? { authorization: `Bearer ${credential}` } : {} });
    let response = await get(await this.credential());
    if (response.status === 401 && this.tokenProvider !== null) response = await get(await this.credential(true));
    if (!response.ok) throw await httpError(response);
    return await response.blob();
  }

  /** Posts a message; the idempotency key makes a retry of the same send safe. */
  postMessage(sessionId: string, message: Partial<MessageCreate> & { content: string }, idempotencyKey?: string): Promise<MessageAccepted> {
    return this.request(
      "POST",
      `${this.session(sessionId)}/messages`,
      message,
      idempotencyKey ? { "idempotency-key": idempotencyKey } : {},
    );
  }

  /** Stop: the server ends the running turn, keeping what streamed (not just a dropped connection). */
  cancel(sessionId: string, clearQueue = false): Promise<CancelResult> {
    return this.request("POST", `${this.session(sessionId)}/cancel`, { clear_queue: clearQueue });
  }

  withdraw(sessionId: string, messageId: string): Promise<unknown> {
    return this.request("DELETE", `${this.session(sessionId)}/queue/${encodeURIComponent(messageId)}`);
  }

  /** POST .../approvals (issue 14): one answer covering every open request of the round. */
  decide(sessionId: string, decisions: ApprovalDecision[]): Promise<unknown> {
    return this.request("POST", `${this.session(sessionId)}/approvals`, { decisions });
  }

  /** POST .../tool_results (issue 14): the results of client tools the turn waits for. */
  toolResults(sessionId: string, results: ClientToolResult[]): Promise<unknown> {
    return this.request("POST", `${this.session(sessionId)}/tool_results`, { results });
  }

  /** GET .../pending (issue 14): what waits, for a page that reloads. */
  pending(sessionId: string): Promise<PendingList> {
    return this.request("GET", `${this.session(sessionId)}/pending`);
  }

  /** The active path's newest turns, each with its parent and siblings ("< i/n >"). */
  turns(sessionId: string, limit = 100): Promise<TurnPage> {
    return this.request("GET", `${this.session(sessionId)}/turns?limit=${limit}`);
  }

  private turn(sessionId: string, turnId: string): string {
    return `${this.session(sessionId)}/turns/${encodeURIComponent(turnId)}`;
  }

  private keyed(idempotencyKey?: string): Record<string, string> {
    return idempotencyKey ? { "idempotency-key": idempotencyKey } : {};
  }

  /** Answers the turn's user input again in a new turn beside it (optionally with another model). */
  regenerate(sessionId: string, turnId: string, body: Partial<RegenerateRequest> = {}, idempotencyKey?: string): Promise<BranchTurn> {
    return this.request("POST", `${this.turn(sessionId, turnId)}/regenerate`, body, this.keyed(idempotencyKey));
  }

  /** Sends an edited user message in a new turn beside the turn. */
  edit(sessionId: string, turnId: string, body: Partial<EditRequest> & { content: string }, idempotencyKey?: string): Promise<BranchTurn> {
    return this.request("POST", `${this.turn(sessionId, turnId)}/edit`, body, this.keyed(idempotencyKey));
  }

  /** Makes the active path the one through the turn, down to the latest turn under it. */
  activate(sessionId: string, turnId: string, body: Partial<ActivateRequest> = {}, idempotencyKey?: string): Promise<ActivePath> {
    return this.request("POST", `${this.turn(sessionId, turnId)}/activate`, body, this.keyed(idempotencyKey));
  }

  /** A new session whose history is the active path up to and including the turn. */
  fork(sessionId: string, turnId: string, idempotencyKey?: string): Promise<Session> {
    return this.request("POST", `${this.session(sessionId)}/fork`, { turn_id: turnId }, this.keyed(idempotencyKey));
  }
}

export interface UploadOptions {
  /** Bytes of the request body sent so far, of `total` (the multipart body: a little more than the file). */
  onProgress?: (sent: number, total: number) => void;
}

/** A POST through XMLHttpRequest, answered as a fetch Response (so errors read the same), with the upload's
 * progress events passed on. */
function xhrPost(
  url: string,
  headers: Record<string, string>,
  body: FormData,
  onProgress: (sent: number, total: number) => void,
): Promise<Response> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", url);
    for (const [name, value] of Object.entries(headers)) xhr.setRequestHeader(name, value);
    xhr.upload.onprogress = (event) => {
      if (event.lengthComputable) onProgress(event.loaded, event.total);
    };
    xhr.onload = () => {
      const responseHeaders = new Headers();
      for (const line of xhr.getAllResponseHeaders().trim().split(/[\r\n]+/)) {
        const at = line.indexOf(":");
        if (at > 0) responseHeaders.append(line.slice(0, at).trim(), line.slice(at + 1).trim());
      }
      resolve(new Response(xhr.responseText, { status: xhr.status, headers: responseHeaders }));
    };
    xhr.onerror = () => reject(new TypeError("Network error while uploading the file"));
    xhr.onabort = () => reject(new DOMException("The upload was aborted", "AbortError"));
    xhr.send(body);
  });
}
