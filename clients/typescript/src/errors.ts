import type { ErrorBody } from "./types";

/** A response that was not a success: the status and the service's error body (`{"error": {...}}`). */
export class ParleyHttpError extends Error {
  readonly status: number;
  readonly code: string;
  readonly body: ErrorBody | null;
  readonly retryAfterSeconds: number | null;

  constructor(status: number, body: ErrorBody | null, retryAfterSeconds: number | null = null) {
    super(body ? `${status} ${body.code}: ${body.message}` : `HTTP ${status}`);
    this.name = "ParleyHttpError";
    this.status = status;
    this.code = body?.code ?? `http_${status}`;
    this.body = body;
    this.retryAfterSeconds = retryAfterSeconds;
  }

  /** Worth trying again later: a limit (429), an overloaded or restarting server (5xx). */
  get retryable(): boolean {
    return this.status === 429 || this.status === 408 || this.status >= 500;
  }
}

/** Reads a failed response into a ParleyHttpError; a body that is not the error JSON keeps its status. */
export async function httpError(response: Response): Promise<ParleyHttpError> {
  let body: ErrorBody | null = null;
  try {
    const json: unknown = await response.json();
    if (json && typeof json === "object" && "error" in json) body = (json as { error: ErrorBody }).error;
  } catch {
    // not JSON (a proxy's page): the status says enough
  }
  const retryAfter = Number(response.headers.get("retry-after"));
  return new ParleyHttpError(response.status, body, Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter : null);
}
