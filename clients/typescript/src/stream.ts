// One session's event stream over fetch, parsed by eventsource-parser: it sends `Authorization: Bearer`
// (which EventSource cannot), resumes with Last-Event-ID after any cut, backs off with jitter (starting
// from the server's `retry:` hint), drops a frame it has already seen, and reports its connection state.
import { createParser, type EventSourceMessage } from "eventsource-parser";
import { ParleyHttpError, httpError } from "./errors";
import type { ParleyEvent, ResyncEvent } from "./types";

export type ConnectionStatus = "connecting" | "open" | "reconnecting" | "closed";

export interface ConnectionState {
  status: ConnectionStatus;
  /** Failed attempts since the stream was last open. */
  attempt: number;
  /** The HTTP error of the last attempt (a 401 or 404 closes the stream with it), or a network error. */
  error: ParleyHttpError | Error | null;
  /** While reconnecting: milliseconds until the next attempt. */
  retryInMs: number | null;
}

export interface StreamOptions {
  baseUrl: string;
  sessionId: string;
  apiKey?: string | null;
  /**
   * The bearer credential of each connection, instead of `apiKey` (ParleyClient.credential): asked with
   * `refresh: true` after a 401, and the connection tried once more at once before the 401 is final.
   */
  credential?: (refresh: boolean) => Promise<string | null>;
  /** Resume after this position (e.g. a history read's `last_event_id`); none starts live. */
  after?: number | null;
  onEvent: (event: ParleyEvent) => void;
  /** A `resync`: the position could not be replayed; reload the history, then the stream goes on. */
  onResync?: (event: ResyncEvent) => void | Promise<void>;
  onState?: (state: ConnectionState) => void;
  fetch?: typeof fetch;
  /** Backoff: the first delay is the server's `retry:` (or this), doubling up to maxDelayMs, full jitter. */
  initialDelayMs?: number;
  maxDelayMs?: number;
  /** Attempts in a row that fail with a retryable error before the stream gives up (default: never). */
  maxAttempts?: number;
  random?: () => number;
}

/** Statuses that another attempt will not fix: bad key (401), not yours or gone (404), bad position (400). */
const FATAL = new Set([400, 401, 403, 404, 405, 410, 422]);

export class SessionStream {
  private readonly options: StreamOptions;
  private readonly fetchImpl: typeof fetch;
  private lastSeq: number | null;
  private retryMs: number;
  private controller: AbortController | null = null;
  private closed = false;
  private wake: (() => void) | null = null;
  private running: Promise<void> | null = null;
  // A 401 after which the credential was asked for anew: the next 401 in a row is final.
  private refreshed = false;
  state: ConnectionState = { status: "connecting", attempt: 0, error: null, retryInMs: null };

  constructor(options: StreamOptions) {
    this.options = options;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.lastSeq = options.after ?? null;
    this.retryMs = options.initialDelayMs ?? 1000;
  }

  /** The last event seen: what a reconnect sends as Last-Event-ID. */
  get lastEventId(): number | null {
    return this.lastSeq;
  }

  /** Starts reading; resolves when the stream is closed for good (close(), or a fatal error). */
  start(): Promise<void> {
    this.running ??= this.run();
    return this.running;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.controller?.abort();
    this.wake?.();
    this.setState({ status: "closed", attempt: this.state.attempt, error: this.state.error, retryInMs: null });
  }

  /** Reconnect now instead of waiting out the backoff (e.g. the page became visible again). */
  reconnectNow(): void {
    this.wake?.();
  }

  private setState(state: ConnectionState): void {
    this.state = state;
    this.options.onState?.(state);
  }

  private url(): string {
    const base = this.options.baseUrl.replace(/\/$/, "");
    const url = `${base}/v1/sessions/${encodeURIComponent(this.options.sessionId)}/events`;
    return this.lastSeq === null ? url : `${url}?after=${this.lastSeq}`;
  }

  private async run(): Promise<void> {
    let attempt = 0;
    while (!this.closed) {
      this.setState({
        status: attempt === 0 ? "connecting" : "reconnecting",
        attempt,
        error: this.state.error,
        retryInMs: null,
      });
      let error: Error | null = null;
      try {
        const opened = await this.readOnce(() => {
          attempt = 0;
          this.setState({ status: "open", attempt: 0, error: null, retryInMs: null });
        });
        if (!opened) error = this.state.error;
      } catch (caught) {
        if (this.closed) break;
        error = caught instanceof Error ? caught : new Error(String(caught));
        if (error instanceof ParleyHttpError && error.status === 401 && this.options.credential && !this.refreshed) {
          this.refreshed = true;
          continue; // at once, with a credential asked for anew (readOnce)
        }
        if (error instanceof ParleyHttpError && FATAL.has(error.status)) {
          this.state = { ...this.state, error };
          this.close();
          break;
        }
      }
      if (this.closed) break;
      attempt += 1;
      const max = this.options.maxAttempts;
      if (max !== undefined && attempt > max) {
        this.state = { ...this.state, error };
        this.close();
        break;
      }
      const delay = this.backoff(attempt, error);
      this.setState({ status: "reconnecting", attempt, error, retryInMs: delay });
      await this.sleep(delay);
    }
  }

  /** Full jitter over an exponential ceiling that starts at the server's `retry:` hint. */
  private backoff(attempt: number, error: Error | null): number {
    const max = this.options.maxDelayMs ?? 30_000;
    const ceiling = Math.min(max, this.retryMs * 2 ** Math.max(0, attempt - 1));
    const random = this.options.random ?? Math.random;
    let delay = ceiling / 2 + (random() * ceiling) / 2;
    if (error instanceof ParleyHttpError && error.retryAfterSeconds !== null) {
      delay = Math.max(delay, error.retryAfterSeconds * 1000);
    }
    return Math.round(delay);
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
      this.wake = () => {
        this.wake = null;
        done();
      };
    });
  }

  /** One connection: true once it was open (any frame arrived), whatever ended it. */
  private async readOnce(onOpen: () => void): Promise<boolean> {
    const controller = (this.controller = new AbortController());
    const headers: Record<string, string> = { accept: "text/event-stream" };
    const credential = this.options.credential
      ? await this.options.credential(this.refreshed)
      : (this.options.apiKey ?? null);
    if (credential) headers.authorization = `Bearer ${credential}`;
    if (this.lastSeq !== null) headers["last-event-id"] = String(this.lastSeq);
    const response = await this.fetchImpl(this.url(), { headers, signal: controller.signal, cache: "no-store" });
    if (!response.ok) throw await httpError(response);
    if (!response.body) throw new Error("the event stream has no body");
    this.refreshed = false;
    onOpen();
    const pending: ParleyEvent[] = [];
    const parser = createParser({
      onEvent: (message: EventSourceMessage) => {
        const event = this.accept(message);
        if (event) pending.push(event);
      },
      onRetry: (ms: number) => {
        if (ms > 0) this.retryMs = ms;
      },
    });
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        parser.feed(value);
        while (pending.length > 0) await this.dispatch(pending.shift() as ParleyEvent);
      }
    } catch (caught) {
      if (!this.closed) this.state = { ...this.state, error: caught instanceof Error ? caught : new Error(String(caught)) };
    } finally {
      controller.abort();
    }
    return true;
  }

  /** The frame's event, or null for one already delivered (a resume may overlap what was seen). */
  private accept(message: EventSourceMessage): ParleyEvent | null {
    if (!message.data) return null;
    const event = JSON.parse(message.data) as ParleyEvent;
    if (event.type === "resync") return event;
    if (this.lastSeq !== null && event.seq <= this.lastSeq) return null;
    return event;
  }

  private async dispatch(event: ParleyEvent): Promise<void> {
    if (event.type === "resync") {
      // The stream goes on after the session's current last event; the page reloads the history first.
      this.lastSeq = event.last_event_id;
      await this.options.onResync?.(event);
      this.options.onEvent(event);
      return;
    }
    if (this.lastSeq !== null && event.seq <= this.lastSeq) return;
    this.lastSeq = event.seq;
    this.options.onEvent(event);
  }
}
