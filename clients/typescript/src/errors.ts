// Typed errors for what Effectgate answers, and for not reaching it at all.
//
// Every error answer of the runner API is an RFC 9457 problem with a stable `code`
// (docs/api.md, Errors). `problemFromResponse` turns one into the class registered for
// its code, so a runner writes `if (err instanceof RetryLater)` instead of comparing
// strings. A code this client does not know yet still throws `ProblemError` with the
// code and the whole body. The registry is kept equal to the server's list of codes by
// a test (tests/client_ts).

/** A problem document as Effectgate sends it, with whatever fields the code adds. */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  code: string;
  request_id?: string;
  retry_after_ms?: number;
  errors?: { path: string; message: string }[];
  [field: string]: unknown;
}

/** The server's request id pattern (X-Request-Id, a problem's `request_id`). */
export const REQUEST_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

/** `value` when it is a request id Effectgate could have made, else null: an id that
 * is quoted to an operator or logged is never arbitrary text from the wire. */
export function validRequestId(value: unknown): string | null {
  return typeof value === "string" && REQUEST_ID.test(value) ? value : null;
}

// C0 and C1 controls, DEL, the line and paragraph separators and the bidirectional
// overrides and isolates: what can forge a log line or reorder what it shows.
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

/** Text that came from the wire, safe to put in a log line: control characters removed. */
export function withoutControls(text: string): string {
  return text.replace(CONTROL, "");
}

/** The base of everything this package throws about Effectgate. */
export class EffectgateError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Effectgate did not answer (connection refused, timeout, lost answer, 5xx), and
 * repeating the call as often as allowed did not help. */
export class TransportError extends EffectgateError {
  readonly method: string;
  readonly path: string;
  /** The `X-Request-Id` of the last answer, when one came (a 5xx from Effectgate). */
  readonly requestId: string | null;

  constructor(
    message: string,
    opts: { method: string; path: string; requestId?: string | null; cause?: unknown },
  ) {
    super(message, { cause: opts.cause });
    this.method = opts.method;
    this.path = opts.path;
    this.requestId = validRequestId(opts.requestId);
  }
}

/** The tool ran, but its outcome could not be posted: Effectgate was unreachable.
 *
 * Keep `outcome` and post it again with `client.postOutcome(operationId, attempt,
 * outcome)` when Effectgate answers. Never run the tool again instead: the lease will
 * expire and Effectgate will ask what happened. */
export class OutcomeNotRecorded extends TransportError {
  readonly operationId: string;
  readonly attempt: number;
  readonly outcome: Record<string, unknown>;

  constructor(
    message: string,
    opts: {
      operationId: string;
      attempt: number;
      outcome: Record<string, unknown>;
      requestId?: string | null;
      cause?: unknown;
    },
  ) {
    super(message, {
      method: "POST",
      path: `/operations/${opts.operationId}/attempts/${opts.attempt}/outcome`,
      requestId: opts.requestId ?? null,
      cause: opts.cause,
    });
    this.operationId = opts.operationId;
    this.attempt = opts.attempt;
    this.outcome = opts.outcome;
  }
}

/** `putTool` stored the contract as a version that is not active (it weakens the active
 * one, or the server holds new tools for a person): operations keep running under the
 * active version until a person activates this one. `answer` is the whole answer. */
export class ContractNotActive extends EffectgateError {
  readonly answer: Record<string, unknown>;
  readonly tool: string;
  readonly version: unknown;
  readonly activeVersion: unknown;
  readonly weakens: string[];

  constructor(answer: Record<string, unknown>) {
    super(inactiveContractMessage(answer));
    this.answer = answer;
    this.tool = String(answer["name"]);
    this.version = answer["version"];
    this.activeVersion = answer["active_version"];
    this.weakens = Array.isArray(answer["weakens"]) ? answer["weakens"].map(String) : [];
  }
}

/** What a stored-but-inactive contract version means, and what a person must do (the
 * Python client's wording). */
export function inactiveContractMessage(answer: Record<string, unknown>): string {
  const name = answer["name"];
  const version = answer["version"];
  const active = answer["active_version"];
  const now =
    active !== null && active !== undefined
      ? `until then operations run under version ${String(active)}`
      : "until then the tool has no active version and operations of it are refused";
  const weakens = Array.isArray(answer["weakens"]) ? answer["weakens"].map(String) : [];
  if (weakens.length === 0) {
    return (
      `Version ${String(version)} of ${String(name)} is stored but not active: a person made ` +
      `version ${String(active)} the active one. A person allowed to activate the tool can ` +
      `activate version ${String(version)} again on the tool's console page (Tools, ` +
      `${String(name)}, Versions); ${now}.`
    );
  }
  return (
    `Effectgate stored version ${String(version)} of ${String(name)} but did not activate it ` +
    `(${weakens.join("; ")}). A person allowed to activate the tool, who does not own this ` +
    `runner, must review it and press Activate on the tool's console page (Tools, ` +
    `${String(name)}, Versions); ${now}.`
  );
}

/** An answer that is neither a success nor a problem document (a proxy's page). */
export class UnexpectedResponse extends EffectgateError {
  readonly status: number;
  readonly text: string;
  readonly requestId: string | null;

  constructor(status: number, text: string, requestId: string | null = null) {
    super(`HTTP ${status}: ${withoutControls(text.slice(0, 200))}`);
    this.status = status;
    this.text = text;
    this.requestId = validRequestId(requestId);
  }
}

type ProblemClass = new (
  problem: Problem,
  opts: { status: number; retryAfterMs?: number | null; requestId?: string | null },
) => ProblemError;

/** An RFC 9457 problem answered by Effectgate.
 *
 * `code` is the stable machine-readable reason; `detail` a sentence for people;
 * `errors` the validation errors (JSON pointers and messages); `retryAfterMs` how long
 * Effectgate asks to wait (body `retry_after_ms` or the `Retry-After` header);
 * `requestId` the request's id (body `request_id`, else the `X-Request-Id` header), to
 * quote when asking an operator about it. */
export class ProblemError extends EffectgateError {
  /** The class of each code the client knows; `problemFromResponse` reads it. */
  static readonly registry: Record<string, ProblemClass> = {};
  static readonly code: string = "problem";

  readonly problem: Problem;
  readonly status: number;
  readonly code: string;
  readonly title: string;
  readonly detail: string;
  readonly errors: { path: string; message: string }[];
  readonly retryAfterMs: number | null;
  readonly requestId: string | null;
  /** Set by the client: whether this answered a repeat of a call whose first answer was
   * lost (the first try may then have caused the refusal). */
  repeated = false;

  constructor(
    problem: Problem,
    opts: { status: number; retryAfterMs?: number | null; requestId?: string | null },
  ) {
    const code = String(problem.code || (new.target as typeof ProblemError).code);
    const title = String(problem.title ?? "");
    const detail = String(problem.detail || title || code);
    super(withoutControls(`${opts.status} ${code}: ${detail}`));
    this.problem = problem;
    this.status = opts.status;
    this.code = code;
    this.title = title;
    this.detail = detail;
    this.errors = Array.isArray(problem.errors) ? problem.errors : [];
    this.retryAfterMs = opts.retryAfterMs ?? null;
    // The body's id, else the header's; an id not of the server's pattern is dropped.
    this.requestId = validRequestId(problem.request_id) ?? validRequestId(opts.requestId);
  }

  /** A tool-result envelope for a refusal that left no operation to ask about (invalid
   * arguments, a run out of budget): the keys of `GET /operations/{id}/tool-result`, so
   * the model reads one shape. */
  forModel(): Record<string, unknown> {
    return {
      status: "refused",
      code: this.code,
      logical_operation_id: this.problem["operation"] ?? null,
      message: this.detail,
      allowed_next_actions: [],
      ...(this.errors.length ? { errors: this.errors } : {}),
    };
  }
}

// --- generic codes (the API's exception handler, docs/api.md Errors) -------------------
export class NotAuthenticated extends ProblemError {
  static override readonly code: string = "not_authenticated";
}
export class Forbidden extends ProblemError {
  static override readonly code: string = "forbidden";
}
export class NotFound extends ProblemError {
  static override readonly code: string = "not_found";
}
export class MethodNotAllowed extends ProblemError {
  static override readonly code: string = "method_not_allowed";
}
export class NotAcceptable extends ProblemError {
  static override readonly code: string = "not_acceptable";
}
export class MalformedJSON extends ProblemError {
  static override readonly code: string = "malformed_json";
}
export class InvalidRequest extends ProblemError {
  static override readonly code: string = "invalid_request";
}
export class PayloadTooLarge extends ProblemError {
  static override readonly code: string = "payload_too_large";
}
export class UnsupportedMediaType extends ProblemError {
  static override readonly code: string = "unsupported_media_type";
}
export class NumberOutOfRange extends ProblemError {
  static override readonly code: string = "number_out_of_range";
}
export class RateLimited extends ProblemError {
  static override readonly code: string = "rate_limited";
}
export class InternalError extends ProblemError {
  static override readonly code: string = "internal_error";
}

// --- tools, runs and registration ------------------------------------------------------
export class InvalidContract extends ProblemError {
  static override readonly code: string = "invalid_contract";
}
export class UnknownTool extends ProblemError {
  static override readonly code: string = "unknown_tool";
}
/** The tool has versions but none is active: a person must activate one first. */
export class ToolNotActive extends ProblemError {
  static override readonly code: string = "tool_not_active";
}
/** Another runner owns this tool: register your own name. */
export class ToolNotOwned extends ProblemError {
  static override readonly code: string = "tool_not_owned";
}
export class OperationKeyRequired extends ProblemError {
  static override readonly code: string = "operation_key_required";
}
/** The arguments do not match the tool's schema: the model should fix them. */
export class InvalidArguments extends ProblemError {
  static override readonly code: string = "invalid_arguments";
}
/** The operation key names an operation with another intent: a runner bug. */
export class IntentMismatch extends ProblemError {
  static override readonly code: string = "intent_mismatch";
}
/** The run's principal is not a usable identity (`user:alice`, `service:billing`...). */
export class InvalidPrincipal extends ProblemError {
  static override readonly code: string = "invalid_principal";
}
export class RunNotActive extends ProblemError {
  static override readonly code: string = "run_not_active";
}
export class UrlNotAllowed extends ProblemError {
  static override readonly code: string = "url_not_allowed";
}
export class ForbiddenByPolicy extends ProblemError {
  static override readonly code: string = "forbidden_by_policy";
}

// --- claim refusals, in the order Effectgate checks them (docs/api.md, Attempts) -------
export class OperationClosed extends ProblemError {
  static override readonly code: string = "operation_closed";
}
export class ReconciliationRequired extends ProblemError {
  static override readonly code: string = "reconciliation_required";
}
export class CompensationRequired extends ProblemError {
  static override readonly code: string = "compensation_required";
}
export class ApprovalRequired extends ProblemError {
  static override readonly code: string = "approval_required";
}
export class AttemptInProgress extends ProblemError {
  static override readonly code: string = "attempt_in_progress";
}
export class ToolForbidden extends ProblemError {
  static override readonly code: string = "tool_forbidden";
}
export class GrantInvalid extends ProblemError {
  static override readonly code: string = "grant_invalid";
}
export class RetryLater extends ProblemError {
  static override readonly code: string = "retry_later";
}
/** Registration: the run's budget is spent. Claim: the operation's deadline passed. */
export class BudgetExhausted extends ProblemError {
  static override readonly code: string = "budget_exhausted";
}
export class ConcurrencyConflict extends ProblemError {
  static override readonly code: string = "concurrency_conflict";
}

/** A person approved the operation with changes; `successor` is the one to run. */
export class Superseded extends ProblemError {
  static override readonly code: string = "superseded";

  get successor(): string | null {
    const value = this.problem["successor"];
    return typeof value === "string" && value ? value : null;
  }
}

// --- attempts, reconciliation, compensation, events ------------------------------------
export class StaleAttempt extends ProblemError {
  static override readonly code: string = "stale_attempt";
}
export class OutcomeConflict extends ProblemError {
  static override readonly code: string = "outcome_conflict";
}
export class NotUnknown extends ProblemError {
  static override readonly code: string = "not_unknown";
}
export class NotCompensating extends ProblemError {
  static override readonly code: string = "not_compensating";
}
export class InvalidTransition extends ProblemError {
  static override readonly code: string = "invalid_transition";
}
export class DecisionRefused extends ProblemError {
  static override readonly code: string = "decision_refused";
}
export class InvalidSignature extends ProblemError {
  static override readonly code: string = "invalid_signature";
}
export class StaleEvent extends ProblemError {
  static override readonly code: string = "stale_event";
}
export class PolicyInvalid extends ProblemError {
  static override readonly code: string = "policy_invalid";
}

export class NotSealed extends ProblemError {
  static override readonly code: string = "not_sealed";
}


// Each class under its code, for problemFromResponse.
for (const cls of [
  NotAuthenticated,
  Forbidden,
  NotFound,
  MethodNotAllowed,
  NotAcceptable,
  MalformedJSON,
  InvalidRequest,
  PayloadTooLarge,
  UnsupportedMediaType,
  NumberOutOfRange,
  RateLimited,
  InternalError,
  InvalidContract,
  UnknownTool,
  ToolNotActive,
  ToolNotOwned,
  OperationKeyRequired,
  InvalidArguments,
  IntentMismatch,
  InvalidPrincipal,
  RunNotActive,
  UrlNotAllowed,
  ForbiddenByPolicy,
  OperationClosed,
  ReconciliationRequired,
  CompensationRequired,
  ApprovalRequired,
  AttemptInProgress,
  ToolForbidden,
  GrantInvalid,
  RetryLater,
  BudgetExhausted,
  ConcurrencyConflict,
  Superseded,
  StaleAttempt,
  OutcomeConflict,
  NotUnknown,
  NotCompensating,
  InvalidTransition,
  DecisionRefused,
  InvalidSignature,
  StaleEvent,
  PolicyInvalid,
  NotSealed,
]) {
  ProblemError.registry[cls.code] = cls;
}

/** How long the answer asks to wait, in ms: body `retry_after_ms`, else `Retry-After`
 * in seconds (an HTTP date is not something Effectgate sends). */
export function retryAfterMs(body: unknown, headers: Headers): number | null {
  const value =
    body !== null && typeof body === "object" ? (body as Record<string, unknown>)["retry_after_ms"] : undefined;
  if (typeof value === "number" && Number.isFinite(value) && value >= 0) return Math.floor(value);
  const header = headers.get("retry-after");
  if (header !== null && header.trim() !== "") {
    const seconds = Number(header);
    if (Number.isFinite(seconds)) return Math.max(0, Math.floor(seconds * 1000));
  }
  return null;
}

/** The typed error for an error answer whose body was read as `text`. */
export function problemFromResponse(
  status: number,
  headers: Headers,
  text: string,
): ProblemError | UnexpectedResponse {
  const requestId = headers.get("x-request-id");
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return new UnexpectedResponse(status, text, requestId);
  }
  if (body === null || typeof body !== "object" || Array.isArray(body) || !("code" in body)) {
    return new UnexpectedResponse(status, text, requestId);
  }
  const problem = body as Problem;
  const cls = ProblemError.registry[String(problem.code)] ?? ProblemError;
  return new cls(problem, { status, retryAfterMs: retryAfterMs(body, headers), requestId });
}
