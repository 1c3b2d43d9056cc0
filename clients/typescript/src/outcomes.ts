// What a tool call did, as the runner tells Effectgate (docs/api.md, outcome bodies).
//
// A tool function returns a value (or a `Succeeded`) when the effect happened, and
// throws `NotSent`, `Failed` or `Unknown` when it did not or when nobody knows. Anything
// else it throws is posted as `unknown`: a runner that cannot tell whether the request
// left the process must not claim that it did not.

export const NOT_SENT = "not_sent";

/** The effect happened. `downstreamId` is the provider's reference for it. */
export class Succeeded<T = unknown> {
  readonly result: T | undefined;
  readonly downstreamId: string | undefined;
  readonly cost: number | undefined;

  constructor(opts: { result?: T; downstreamId?: string; cost?: number } = {}) {
    this.result = opts.result;
    this.downstreamId = opts.downstreamId;
    this.cost = opts.cost;
  }

  body(): Record<string, unknown> {
    const body: Record<string, unknown> = { kind: "succeeded" };
    if (this.result !== undefined && this.result !== null) body["result"] = this.result;
    if (this.downstreamId) body["downstream_id"] = this.downstreamId;
    if (this.cost !== undefined) body["cost"] = this.cost;
    return body;
  }
}

export interface OutcomeOptions {
  retryAfterMs?: number;
  cost?: number;
}

/** Thrown by a tool function to say how an attempt ended without success. */
export abstract class ToolOutcome extends Error {
  abstract readonly kind: "failed" | "unknown";
  readonly code: string;
  readonly detail: string;
  readonly retryAfterMs: number | undefined;
  readonly cost: number | undefined;

  constructor(code: string, detail = "", opts: OutcomeOptions = {}) {
    super(`${code}: ${detail}`.replace(/: $/, ""));
    this.name = new.target.name;
    this.code = code;
    this.detail = detail;
    this.retryAfterMs = opts.retryAfterMs;
    this.cost = opts.cost;
  }

  body(): Record<string, unknown> {
    const body: Record<string, unknown> = { kind: this.kind, code: this.code };
    if (this.detail) body["detail"] = this.detail.slice(0, 4000);
    if (this.retryAfterMs !== undefined) body["retry_after_ms"] = Math.trunc(this.retryAfterMs);
    if (this.cost !== undefined) body["cost"] = this.cost;
    return body;
  }
}

/** The provider refused or failed the call. A code in the contract's `retryable_codes`
 * (which must mean "not processed") leads to a retry with backoff; any other code ends
 * the operation (`failed_permanent`). */
export class Failed extends ToolOutcome {
  readonly kind = "failed" as const;
}

/** Nothing left the runner: retrying is safe whatever the effect class. */
export class NotSent extends Failed {
  constructor(detail = "", opts: { retryAfterMs?: number } = {}) {
    super(NOT_SENT, detail, opts);
  }
}

/** The request may have reached the provider and nobody knows what it did (a timeout
 * after sending, a connection lost before the answer). Never retried by the runner. */
export class Unknown extends ToolOutcome {
  readonly kind = "unknown" as const;

  constructor(code = "timeout_unknown", detail = "", opts: OutcomeOptions = {}) {
    super(code, detail, opts);
  }
}

/** Where a request went, as `the provider at HOST[:PORT]`: never the path, the query or
 * credentials, which may hold secrets. */
function provider(url: string | URL | undefined): string {
  if (url === undefined) return "the provider";
  try {
    const parsed = new URL(String(url));
    return `the provider at ${parsed.host}`;
  } catch {
    return "the provider";
  }
}

// Error codes of Node's fetch (undici) and sockets that prove the request never left:
// no connection was made, so the server cannot have seen it.
const NOT_CONNECTED = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
  "ERR_INVALID_URL",
]);

function causeCode(error: unknown): string | undefined {
  for (let current: unknown = error, depth = 0; current && depth < 4; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/** Classify a failed `fetch` to the outside world, conservatively.
 *
 * Only a failure to connect proves that the request never left (`NotSent`). A timeout
 * (an aborted signal) or a connection that broke after the request was written may have
 * been processed, so it is `Unknown`; so is anything this function does not recognise.
 * The detail names the provider's host and the error's code, never the URL's path or
 * query. */
export function outcomeFromFetchError(error: unknown, url?: string | URL): ToolOutcome {
  const where = provider(url);
  const code = causeCode(error);
  const name = error instanceof Error ? error.name : typeof error;
  if (code !== undefined && NOT_CONNECTED.has(code)) {
    const text = `${where} could not be reached (${code}); nothing was sent.`;
    return new NotSent(text[0]!.toUpperCase() + text.slice(1));
  }
  if (name === "TimeoutError" || name === "AbortError") {
    return new Unknown("timeout_unknown", `${name} after the request was sent to ${where}.`);
  }
  return new Unknown("connection_lost", `${name} (${code ?? "no code"}) after the request was sent to ${where}.`);
}
