// The runner API over HTTP, one method per endpoint (docs/api.md).
//
// `EffectgateClient` repeats its own calls when Effectgate's answer is lost (a network
// error, a timeout, a 429 or 5xx from Effectgate or a proxy in front of it), with the
// Python client's rules, because the API makes each repeat safe:
//
// - `register`: the same operation key with the same intent answers the same operation
//   (200), never a second one; an inline claim is ignored on a replay, so an attempt
//   whose answer was lost is never run and its lease expires into the outcome table.
// - `claim`: a repeat either claims (the first never committed) or is refused with
//   `attempt_in_progress` (it did); the tool runs only with a 201 in hand.
// - `postOutcome`: the same outcome for the same attempt answers 200 with the same body.
//   `heartbeat` and every GET are idempotent; `putTool` with an unchanged contract
//   answers the same version.
// - `createRun` is the exception: a lost answer may leave an empty run behind. It holds
//   no operation and costs nothing.
//
// Protocol refusals (409, 403, 422...) are never repeated here: they are answers,
// thrown as the typed errors of ./errors.ts.

import {
  ContractNotActive,
  NotCompensating,
  NotUnknown,
  ProblemError,
  TransportError,
  UnexpectedResponse,
  problemFromResponse,
} from "./errors.js";
import type {
  Approval,
  Attempt,
  Compensation,
  Heartbeat,
  Operation,
  OperationEvent,
  OutcomeAnswer,
  OperationPage,
  Reconciliation,
  RegisterBody,
  RegisteredOperation,
  Run,
  RunBody,
  Tool,
  ToolContract,
  ToolResultEnvelope,
} from "./types.js";

export const API_PREFIX = "/api/v1";
/** Answers after which repeating the same call is both safe (see above) and useful. */
export const RETRY_STATUSES: ReadonlySet<number> = new Set([429, 500, 502, 503, 504]);
export const USER_AGENT = "effectgate-client-typescript/1.0.0";
export const MAX_RESPONSE_BYTES = 8 * 1024 * 1024;
export const MAX_RETRY_WAIT_MS = 60_000;
/** Node runs a timer of more than 2**31 - 1 ms at once: no wait is longer. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** An answer body longer than the client reads (`maxResponseBytes`). */
class BodyTooLarge extends Error {}

/** The body as text, read no further than `limit` bytes; a longer body cancels the
 * reader and throws `BodyTooLarge`. */
async function boundedText(response: Response, limit: number): Promise<string> {
  const declared = response.headers.get("content-length");
  if (declared !== null && /^\d+$/.test(declared.trim()) && Number(declared) > limit) {
    await response.body?.cancel().catch(() => undefined);
    throw new BodyTooLarge(`Content-Length ${declared}`);
  }
  if (response.body === null) return "";
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel().catch(() => undefined);
      throw new BodyTooLarge(`more than ${limit} bytes`);
    }
    chunks.push(value);
  }
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.byteLength;
  }
  return new TextDecoder().decode(bytes);
}

export interface EffectgateClientOptions {
  /** The server's root (`https://effectgate.internal`, without `/api/v1`). */
  baseUrl: string;
  /** The runner's token (`egr_...`). */
  token: string;
  /** Each request's timeout, in milliseconds (default 10 000). */
  timeoutMs?: number;
  /** How often a call whose answer was lost is repeated (default 6). */
  maxRetries?: number;
  /** The first backoff's ceiling and the cap, in milliseconds (defaults 50 and 2000). */
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  /** A `fetch` of your own (a proxy agent, a test double). */
  fetch?: typeof fetch;
  /** How the client waits between repeats (tests pass a fake). */
  sleep?: (ms: number) => Promise<void>;
  userAgent?: string;
  /** The largest answer body read, in bytes (default 8 MiB): a longer one is not read
   * further and throws `UnexpectedResponse`. */
  maxResponseBytes?: number;
  /** The longest wait between repeats that an answer's `Retry-After` or
   * `retry_after_ms` can ask for, in milliseconds (default 60 000). */
  maxRetryWaitMs?: number;
}

export interface RequestOptions {
  body?: unknown;
  query?: Record<string, string | number | boolean | null | undefined>;
  /** This call's bound on repeats instead of the client's. */
  maxRetries?: number;
  signal?: AbortSignal;
}

const sleepMs = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

function segment(value: string | number): string {
  return encodeURIComponent(String(value));
}

/** A client for one runner token; share it within a process. */
export class EffectgateClient {
  readonly baseUrl: string;
  readonly maxRetries: number;
  readonly timeoutMs: number;
  readonly backoffBaseMs: number;
  readonly backoffMaxMs: number;
  readonly maxResponseBytes: number;
  readonly maxRetryWaitMs: number;
  /** Counts of repeated calls by reason, for operators and benchmarks. */
  readonly stats: Map<string, number> = new Map();
  readonly #token: string;
  readonly #fetch: typeof fetch;
  readonly #sleep: (ms: number) => Promise<void>;
  readonly #userAgent: string;

  constructor(opts: EffectgateClientOptions) {
    if (!opts.baseUrl) throw new TypeError("baseUrl is required");
    if (!opts.token) throw new TypeError("token is required");
    this.baseUrl = opts.baseUrl.replace(/\/+$/, "");
    this.#token = opts.token;
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    this.maxRetries = opts.maxRetries ?? 6;
    this.backoffBaseMs = opts.backoffBaseMs ?? 50;
    this.backoffMaxMs = opts.backoffMaxMs ?? 2000;
    this.#fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.#sleep = opts.sleep ?? sleepMs;
    this.#userAgent = opts.userAgent ?? USER_AGENT;
    this.maxResponseBytes = opts.maxResponseBytes ?? MAX_RESPONSE_BYTES;
    this.maxRetryWaitMs = Math.min(opts.maxRetryWaitMs ?? MAX_RETRY_WAIT_MS, MAX_TIMER_MS);
  }

  // --- transport ----------------------------------------------------------------------

  /** Capped exponential backoff with full jitter. */
  backoffMs(retry: number): number {
    const ceiling = Math.min(this.backoffMaxMs, this.backoffBaseMs * 2 ** retry);
    return Math.random() * ceiling;
  }

  #count(reason: string): void {
    this.stats.set(reason, (this.stats.get(reason) ?? 0) + 1);
  }

  /** One API call (`path` under /api/v1), repeated while the answer is lost; the JSON
   * body of a success (`undefined` for an empty one).
   *
   * Throws the typed `ProblemError` for a problem answer, `TransportError` when
   * Effectgate stayed unreachable, `UnexpectedResponse` for anything else. */
  async request<T>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    const retries = opts.maxRetries ?? this.maxRetries;
    let url = this.baseUrl + API_PREFIX + path;
    if (opts.query) {
      const params = new URLSearchParams();
      for (const [key, value] of Object.entries(opts.query)) {
        if (value !== undefined && value !== null) params.set(key, String(value));
      }
      const text = params.toString();
      if (text) url += (url.includes("?") ? "&" : "?") + text;
    }
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.#token}`,
      Accept: "application/json",
      "User-Agent": this.#userAgent,
    };
    let payload: string | undefined;
    if (opts.body !== undefined) {
      payload = JSON.stringify(opts.body);
      headers["Content-Type"] = "application/json";
    }
    for (let retry = 0; ; retry++) {
      let wait: number | null = null;
      let response: Response;
      let text: string;
      const timeout = AbortSignal.timeout(this.timeoutMs);
      const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
      try {
        response = await this.#fetch(url, {
          method,
          headers,
          body: payload ?? null,
          redirect: "manual",
          signal,
        });
        text = await boundedText(response, this.maxResponseBytes);
      } catch (error) {
        if (error instanceof BodyTooLarge) {
          // Not an answer of Effectgate's (its answers are small): never repeated.
          throw new UnexpectedResponse(
            response!.status,
            `an answer body of ${error.message}, over maxResponseBytes (${this.maxResponseBytes})`,
            response!.headers.get("x-request-id"),
          );
        }
        if (opts.signal?.aborted) throw opts.signal.reason;
        if (retry >= retries) {
          throw new TransportError(
            `${method} ${path}: no answer after ${retry + 1} tries (${describe(error)})`,
            { method, path, cause: error },
          );
        }
        this.#count(`lost:${errorName(error)}`);
        await this.#sleep(this.backoffMs(retry));
        continue;
      }
      if (response.status >= 200 && response.status < 300) {
        if (!text) return undefined as T;
        try {
          return JSON.parse(text) as T;
        } catch {
          // A success that is not JSON is no answer of Effectgate's (a proxy's page).
          throw new UnexpectedResponse(response.status, text, response.headers.get("x-request-id"));
        }
      }
      const error = problemFromResponse(response.status, response.headers, text);
      if (!RETRY_STATUSES.has(response.status) || retry >= retries) {
        // A refusal that answers a repeat may be caused by the first try having gone
        // through (`not_unknown` after a lost answer).
        if (error instanceof ProblemError) error.repeated = retry > 0;
        throw error;
      }
      this.#count(`status:${response.status}`);
      if (error instanceof ProblemError && error.retryAfterMs !== null) wait = error.retryAfterMs;
      else if (error instanceof ProblemError === false) {
        // A proxy's 503 page may still say when to come back.
        const header = response.headers.get("retry-after");
        const seconds = header === null ? NaN : Number(header);
        if (Number.isFinite(seconds) && seconds >= 0) wait = seconds * 1000;
      }
      // The server's ask is obeyed up to a bound: an answer cannot park the caller.
      await this.#sleep(wait === null ? this.backoffMs(retry) : Math.min(wait, this.maxRetryWaitMs));
    }
  }

  // --- tools and runs -----------------------------------------------------------------

  /** Register a contract (`PUT /tools/{name}`) and return the answer.
   *
   * A version Effectgate stores but does not activate (`active: false`) throws
   * `ContractNotActive`, because the calls that follow would silently run under the
   * old contract; `{ inactive: "warn" }` warns (process.emitWarning) and returns it. */
  async putTool(
    name: string,
    contract: ToolContract,
    opts: { inactive?: "raise" | "warn" } = {},
  ): Promise<Tool> {
    const inactive = opts.inactive ?? "raise";
    const answer = await this.request<Tool>("PUT", `/tools/${segment(name)}`, { body: contract });
    if ((answer as { active?: boolean }).active === false) {
      const error = new ContractNotActive(answer as unknown as Record<string, unknown>);
      if (inactive === "raise") throw error;
      process.emitWarning(error.message, { type: "ContractNotActiveWarning" });
    }
    return answer;
  }

  getTool(name: string): Promise<Tool> {
    return this.request("GET", `/tools/${segment(name)}`);
  }

  createRun(body: RunBody): Promise<Run> {
    return this.request("POST", "/runs", { body });
  }

  getRun(id: string): Promise<Run> {
    return this.request("GET", `/runs/${segment(id)}`);
  }

  cancelRun(id: string): Promise<Run> {
    return this.request("POST", `/runs/${segment(id)}/cancel`);
  }

  // --- operations ---------------------------------------------------------------------

  /** Register an intended effect, or get back the one registered under the key.
   *
   * With `claim: { lease_s }` the first attempt is claimed in the same round trip when
   * the new operation is `ready`: the answer then carries `attempt` (or `null` with
   * `claim_error`). A replay (status 200) never claims. */
  register(body: RegisterBody): Promise<RegisteredOperation> {
    if (!body.operation_key) {
      throw new TypeError("operation_key is required: make it before the first attempt");
    }
    return this.request("POST", "/operations", { body });
  }

  getOperation(id: string): Promise<Operation> {
    return this.request("GET", `/operations/${segment(id)}`);
  }

  /** Every matching operation, newest first, following the cursor. */
  async *listOperations(
    filter: { status?: string; run?: string; tool?: string; limit?: number } = {},
  ): AsyncGenerator<Operation> {
    let path = "/operations";
    let query: RequestOptions["query"] = { limit: 200, ...filter };
    for (;;) {
      const page = await this.request<OperationPage>("GET", path, { query });
      yield* page.results;
      if (!page.next) return;
      // The cursor URL is absolute; keep only the part after the API prefix.
      path = page.next.split(API_PREFIX).slice(1).join(API_PREFIX);
      query = undefined;
    }
  }

  events(operationId: string): Promise<OperationEvent[]> {
    return this.request("GET", `/operations/${segment(operationId)}/events`);
  }

  /** The envelope to hand back to the model (status, code, message, next actions). */
  toolResult(operationId: string): Promise<ToolResultEnvelope> {
    return this.request("GET", `/operations/${segment(operationId)}/tool-result`);
  }

  getApproval(id: string): Promise<Approval> {
    return this.request("GET", `/approvals/${segment(id)}`);
  }

  // --- attempts -----------------------------------------------------------------------

  /** Claim the next attempt; throws the claim refusal's typed error. */
  claim(operationId: string, opts: { leaseS?: number } = {}): Promise<Attempt> {
    return this.request("POST", `/operations/${segment(operationId)}/attempts`, {
      body: { lease_s: opts.leaseS ?? 30 },
    });
  }

  heartbeat(
    operationId: string,
    attempt: number,
    opts: { leaseS?: number; maxRetries?: number } = {},
  ): Promise<Heartbeat> {
    return this.request(
      "POST",
      `/operations/${segment(operationId)}/attempts/${Math.trunc(attempt)}/heartbeat`,
      { body: { lease_s: opts.leaseS ?? 30 }, ...(opts.maxRetries === undefined ? {} : { maxRetries: opts.maxRetries }) },
    );
  }

  /** Post an attempt's outcome (`{kind: "succeeded" | "failed" | "unknown", ...}`); the
   * operation after classification. Repeating it is safe. */
  postOutcome(
    operationId: string,
    attempt: number,
    outcome: Record<string, unknown>,
  ): Promise<OutcomeAnswer> {
    return this.request(
      "POST",
      `/operations/${segment(operationId)}/attempts/${Math.trunc(attempt)}/outcome`,
      { body: outcome },
    );
  }

  // --- reconciliation and compensation ------------------------------------------------

  /** Answer an `outcome_unknown` operation: committed, not_found or still_unknown. When
   * a repeat after a lost answer finds it no longer unknown, the first try went through:
   * the operation as it is now is returned. */
  async reconcile(operationId: string, body: Reconciliation): Promise<Operation> {
    try {
      return await this.request("POST", `/operations/${segment(operationId)}/reconciliations`, {
        body,
      });
    } catch (error) {
      if (error instanceof NotUnknown && error.repeated && body.result !== "still_unknown") {
        return this.getOperation(operationId);
      }
      throw error;
    }
  }

  /** Record the undo of a `compensating` operation (`committed` or `failed`). */
  async compensate(operationId: string, body: Compensation): Promise<Operation> {
    try {
      return await this.request("POST", `/operations/${segment(operationId)}/compensations`, {
        body,
      });
    } catch (error) {
      if (error instanceof NotCompensating && error.repeated && body.result === "committed") {
        return this.getOperation(operationId);
      }
      throw error;
    }
  }
}

function errorName(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    const code = cause && typeof cause === "object" ? (cause as { code?: unknown }).code : undefined;
    return typeof code === "string" ? code : error.name;
  }
  return typeof error;
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    const more = cause instanceof Error ? `: ${cause.message}` : "";
    return `${errorName(error)}: ${error.message}${more}`;
  }
  return String(error);
}
