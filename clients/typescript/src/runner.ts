// The runner protocol in one call: `Runner.execute` (docs/api.md, Operations), with the
// Python runner's semantics (client/effectgate_client/runner.py).
//
// `execute` takes one intended effect from registration to an answer the model reads:
//
// 1. Register it under the caller's operation key and claim the first attempt in the
//    same round trip. A replay (the process restarted after registering, or the answer
//    was lost) returns the same operation and claims nothing.
// 2. While the operation waits for a person, wait (`Waiter`: polling with backoff, or
//    notifications from webhooks) until the request is decided or the wait budget ends.
// 3. Claim, obeying every refusal: wait `retry_after_ms` for `retry_later` (a backoff,
//    a not-before, an open breaker) and `attempt_in_progress`, back off on
//    `concurrency_conflict`, go back to waiting on `approval_required` and
//    `grant_invalid`, stop on `operation_closed`, `reconciliation_required` and
//    `budget_exhausted`, run the undo (when one is given) on `compensation_required`,
//    throw `ToolForbidden`. When a person approved with changes (`superseded`), follow
//    the successor and call the tool with the approver's edits applied.
// 4. With a claimed attempt, call the tool with the operation's idempotency key,
//    beating the lease's heartbeat on a timer while the call runs, and post what
//    happened. Effectgate classifies it; a retry (a retryable `failed` code, or
//    `unknown` for a repeatable tool) goes back to step 3.
// 5. Return the tool-result envelope: the one the final outcome's answer carries when
//    the operation ended there, else `GET /operations/{id}/tool-result`.
//
// Nothing here ever calls the tool again after an unknown outcome of an irreversible or
// compensable tool: only Effectgate decides that, after reconciliation. A process that
// dies mid-call posts nothing; the lease expires and Effectgate treats it as unknown.

import { type EffectgateClient, RETRY_STATUSES } from "./client.js";
import {
  ApprovalRequired,
  AttemptInProgress,
  BudgetExhausted,
  CompensationRequired,
  ConcurrencyConflict,
  EffectgateError,
  GrantInvalid,
  OperationClosed,
  OutcomeConflict,
  OutcomeNotRecorded,
  ProblemError,
  ReconciliationRequired,
  RetryLater,
  StaleAttempt,
  Superseded,
  TransportError,
  UnexpectedResponse,
  withoutControls,
} from "./errors.js";
import { Succeeded, ToolOutcome } from "./outcomes.js";
import type {
  ApprovalAsk,
  Attempt,
  Edit,
  Operation,
  RegisterBody,
  ToolResultEnvelope,
} from "./types.js";
import { type Clock, PollingWaiter, type Waiter, monotonic, sleep as sleepMs } from "./waiters.js";

/** The statuses an operation never leaves. */
export const TERMINAL: ReadonlySet<string> = new Set([
  "succeeded",
  "rejected",
  "failed_permanent",
  "budget_exhausted",
  "compensated",
  "cancelled",
  "superseded",
]);

const SAFE_INTEGER = Number.MAX_SAFE_INTEGER;
const MAX_DEPTH = 64;

/** Whether Effectgate's strict JSON accepts `value`: no NaN or infinity, numbers within
 * 2**53, no U+0000 or lone surrogate, nesting under 64 levels, plain data only. */
export function travels(value: unknown, depth = 0): boolean {
  if (depth > MAX_DEPTH) return false;
  if (value === null || typeof value === "boolean") return true;
  if (typeof value === "number") return Number.isFinite(value) && Math.abs(value) <= SAFE_INTEGER;
  if (typeof value === "string") return !value.includes("\u0000") && value.isWellFormed();
  if (Array.isArray(value)) return value.every((item) => travels(item, depth + 1));
  if (typeof value === "object") {
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) return false;
    return Object.entries(value).every(
      ([key, item]) => travels(key, depth) && item !== undefined && travels(item, depth + 1),
    );
  }
  return false;
}

/** An approver's edit this runner will not apply: a path that is not a JSON pointer to
 * an existing place in the arguments (an empty path, an intermediate that is missing or
 * not plain data, an array index out of range) or that names `__proto__`,
 * `constructor` or `prototype`. Thrown before any edit is applied and before the tool
 * is called: the call is not made. */
export class InvalidEdit extends EffectgateError {
  readonly path: string;

  constructor(path: string, reason: string) {
    super(`edit ${JSON.stringify(path.slice(0, 200))} not applied: ${reason}`);
    this.path = path;
  }
}

const FORBIDDEN_TOKENS: ReadonlySet<string> = new Set(["__proto__", "constructor", "prototype"]);
const INDEX = /^(0|[1-9]\d*)$/;

/** How long the text told about a tool's (or undo's) exception may be. */
export const EXCEPTION_DETAIL_CHARS = 200;
const URL_USERINFO = /\b([a-z][a-z0-9+.-]*:\/\/)[^/\s@?#]*@/gi;
const URL_QUERY = /\b([a-z][a-z0-9+.-]*:\/\/[^\s?#]*)[?#]\S*/gi;

/**
 * What is told about a tool's (or undo's) exception, to Effectgate and to the log:
 * `Name: message` with the userinfo and the query string of every URL in it removed,
 * capped at 200 characters (an SDK's error may quote a key or a signed URL). The
 * Python runner's `exception_detail` follows the same rules.
 */
export function exceptionDetail(error: unknown): string {
  const name = error instanceof Error ? error.name : typeof error;
  const message = error instanceof Error ? error.message : String(error);
  const clean = message.replace(URL_USERINFO, "$1").replace(URL_QUERY, "$1");
  return `${name}: ${clean}`.toWellFormed().replaceAll("\u0000", "").slice(0, EXCEPTION_DETAIL_CHARS);
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** Where an edit goes: its container and the last token, checked. */
function locate(
  root: Record<string, unknown>,
  path: string,
): { parent: Record<string, unknown> | unknown[]; last: string } {
  if (typeof path !== "string" || path === "" || !path.startsWith("/")) {
    throw new InvalidEdit(String(path), "not a JSON pointer to a field");
  }
  const tokens = path
    .split("/")
    .slice(1)
    .map((token) => token.replaceAll("~1", "/").replaceAll("~0", "~"));
  for (const token of tokens) {
    if (FORBIDDEN_TOKENS.has(token)) throw new InvalidEdit(path, `the token ${token} is refused`);
  }
  let parent: Record<string, unknown> | unknown[] = root;
  const last = tokens[tokens.length - 1]!;
  for (const token of tokens.slice(0, -1)) {
    let next: unknown;
    if (Array.isArray(parent)) {
      if (!INDEX.test(token) || Number(token) >= parent.length) {
        throw new InvalidEdit(path, `no index ${token} in an array of ${parent.length}`);
      }
      next = parent[Number(token)];
    } else {
      if (!Object.hasOwn(parent, token)) throw new InvalidEdit(path, `no field ${token}`);
      next = parent[token];
    }
    if (!Array.isArray(next) && !isPlainObject(next)) {
      throw new InvalidEdit(path, `${token} holds no object or array`);
    }
    parent = next;
  }
  if (Array.isArray(parent) && (!INDEX.test(last) || Number(last) >= parent.length)) {
    throw new InvalidEdit(path, `no index ${last} in an array of ${parent.length}`);
  }
  return { parent, last };
}

/** The runner's own arguments with an approver's edits applied (each edit's `path` is a
 * JSON pointer, `to` the new value). Applied to the runner's copy, not to the stored
 * arguments, because sensitive values are stored as digests; an approver cannot edit a
 * sensitive field.
 *
 * An edit only replaces (or, in an object, adds) the value at its last token: it steps
 * only through the arguments' own fields and existing array items, never creates one on
 * the way, and refuses `__proto__`, `constructor` and `prototype`. Any edit refused
 * throws `InvalidEdit` before anything is applied. */
export function applyEdits(
  args: Record<string, unknown>,
  edits: readonly Pick<Edit, "path" | "to">[],
): Record<string, unknown> {
  const edited = structuredClone(args);
  // Every path is checked against the arguments before the first is applied; applying
  // one edit never changes where a later one goes, except by replacing a container.
  for (const edit of edits) locate(edited, edit.path);
  for (const edit of edits) {
    const { parent, last } = locate(edited, edit.path);
    const value = structuredClone(edit.to);
    if (Array.isArray(parent)) parent[Number(last)] = value;
    else Object.defineProperty(parent, last, { value, writable: true, enumerable: true, configurable: true });
  }
  return edited;
}

/** What a tool function needs to make its call. */
export interface AttemptContext {
  operationId: string;
  attempt: number;
  /** Send it to the provider (an `Idempotency-Key` header): the same for every attempt
   * of the operation. */
  idempotencyKey: string;
  arguments: Record<string, unknown>;
  leaseUntil: string;
  /** Aborted when the attempt lost its lease (a heartbeat answered `stale_attempt`):
   * a call that has not sent its request yet should not send it. */
  signal: AbortSignal;
}

/** Makes the call to the outside world: returns its result (or a `Succeeded`), or throws
 * `NotSent`, `Failed` or `Unknown`; anything else it throws is posted as `unknown`. */
export type ToolFunction<T = unknown> = (ctx: AttemptContext) => Promise<T>;

/** What `execute` ends with.
 *
 * `envelope` is Effectgate's tool-result for the model; `operation` the last operation
 * body read; `output` what the tool function returned in this process (undefined unless
 * an attempt run here succeeded); `attempts` the attempt numbers this call claimed;
 * `refusal` the code of the refusal that ended the call while the operation can still
 * move on (a wait that ran out), else null. */
export class ToolCallResult<T = unknown> {
  operation: Operation;
  envelope: ToolResultEnvelope;
  output: T | undefined = undefined;
  readonly attempts: number[] = [];
  refusal: string | null = null;

  constructor(operation: Operation, envelope: ToolResultEnvelope) {
    this.operation = operation;
    this.envelope = envelope;
  }

  get status(): string {
    return this.envelope.status;
  }

  /** The envelope, plus the tool's `result` once the operation succeeded: what to hand
   * the model as the tool call's answer. */
  forModel(): Record<string, unknown> {
    const body: Record<string, unknown> = { ...this.envelope };
    if (this.envelope.status === "succeeded" && this.operation.result != null) {
      body["result"] = this.operation.result;
    }
    return body;
  }
}

export interface RunnerOptions {
  /** How `execute` waits for a person or a reconciliation (default: polling). */
  waiter?: Waiter;
  /** Each attempt's lease in seconds (default 30); heartbeats extend it. */
  leaseS?: number;
  /** Seconds between heartbeats (default a third of the lease, at least 0.2). */
  heartbeatEveryS?: number;
  /** How long one `execute` may wait in total (approvals, backoff, `retry_after_ms`,
   * conflicts) before returning with `refusal` set (default 300). */
  waitS?: number;
  /** How long to wait for an unknown outcome to be answered (by a probe or a person)
   * before returning; 0 (the default) returns at once. */
  reconciliationWaitS?: number;
  /** The backoff on `concurrency_conflict`: first ceiling and cap, in seconds. */
  conflictBackoffS?: [number, number];
  sleep?: (ms: number) => Promise<void>;
  clock?: Clock;
  /** Where the runner reports what it could not act on (heartbeat failures, a tool that
   * threw); console.warn by default. */
  log?: (message: string) => void;
}

export interface ExecuteOptions<T> {
  run: string;
  tool: string;
  /** The caller's stable name for this intended effect (the conversation, the turn,
   * the call's position): the same key replays the same operation. */
  operationKey: string;
  arguments: Record<string, unknown>;
  call: ToolFunction<T>;
  callId?: string;
  turn?: number;
  approval?: ApprovalAsk;
  /** For compensable tools: undoes the effect with `ctx.idempotencyKey` (the
   * operation's key suffixed `:undo`); throwing means the undo failed. */
  undo?: ToolFunction<unknown>;
  /** How long, within `waitS`, to wait for a person's decision (0 answers
   * `awaiting_approval` at once; retries still get their backoff). */
  approvalWaitS?: number;
  /** How this call waits, instead of the runner's waiter. */
  waiter?: Waiter;
}

/** Runs tool calls through Effectgate; share one per process. */
export class Runner {
  readonly client: EffectgateClient;
  readonly waiter: Waiter;
  readonly leaseS: number;
  readonly heartbeatEveryS: number;
  /** An attempt starts only while at least this much of its lease is left. */
  readonly leaseMarginS: number;
  readonly waitS: number;
  readonly reconciliationWaitS: number;
  readonly conflictBackoffS: [number, number];
  readonly #sleep: (ms: number) => Promise<void>;
  readonly #clock: Clock;
  readonly #log: (message: string) => void;

  constructor(client: EffectgateClient, opts: RunnerOptions = {}) {
    this.client = client;
    this.#sleep = opts.sleep ?? sleepMs;
    this.#clock = opts.clock ?? monotonic;
    // What is logged quotes the server's words (a problem's detail): never its controls.
    const log = opts.log ?? ((message: string) => console.warn(message));
    this.#log = (message) => log(withoutControls(message));
    this.waiter = opts.waiter ?? new PollingWaiter({ sleep: this.#sleep, clock: this.#clock });
    this.leaseS = opts.leaseS ?? 30;
    this.heartbeatEveryS = opts.heartbeatEveryS ?? Math.max(0.2, this.leaseS / 3);
    this.leaseMarginS = Math.min(5, this.leaseS / 5);
    this.waitS = opts.waitS ?? 300;
    this.reconciliationWaitS = opts.reconciliationWaitS ?? 0;
    this.conflictBackoffS = opts.conflictBackoffS ?? [0.2, 5];
  }

  /** Take one intended effect as far as it can go now (see the module's comment). */
  async execute<T>(opts: ExecuteOptions<T>): Promise<ToolCallResult<T>> {
    const waiter = opts.waiter ?? this.waiter;
    const started = this.#clock();
    const deadline = started + this.waitS * 1000;
    // How long to wait for a person, within the whole wait (0: ask once, go on).
    const approvalDeadline =
      opts.approvalWaitS === undefined
        ? deadline
        : Math.min(deadline, started + opts.approvalWaitS * 1000);
    let args = opts.arguments;
    const body: RegisterBody = {
      run: opts.run,
      tool: opts.tool,
      operation_key: opts.operationKey,
      arguments: args,
      claim: { lease_s: this.leaseS },
    };
    if (opts.callId) body.call_id = opts.callId;
    if (opts.turn !== undefined) body.turn = opts.turn;
    if (opts.approval !== undefined) body.approval = opts.approval;
    // The lease runs from the server's clock at the claim, which is no earlier than when
    // the claim left here: measured from that moment, it cannot be overstated.
    let claimSent = this.#clock();
    const registered = await this.client.register(body);
    // The claim below meets the same refusal as `claim_error`, typed.
    const { attempt: inlineAttempt, claim_error: _claimError, ...first } = registered;
    let attempt: Attempt | null = inlineAttempt ?? null;
    let op: Operation & { tool_result?: ToolResultEnvelope } = first;
    const result = new ToolCallResult<T>(op, undefined as unknown as ToolResultEnvelope);
    let conflicts = 0;
    for (;;) {
      if (attempt !== null) {
        result.attempts.push(attempt.attempt);
        op = await this.#runAttempt(op, attempt, opts.call, args, result, claimSent);
        attempt = null;
        continue;
      }
      const status = op.status;
      if (status === "superseded" && op.superseded_by) {
        // A person approved an edited copy: run that one, with their changes.
        op = await this.client.getOperation(op.superseded_by);
        args = applyEdits(args, op.edits ?? []);
        continue;
      }
      if (TERMINAL.has(status)) break;
      if (status === "outcome_unknown") {
        const waitUntil = Math.min(deadline, started + this.reconciliationWaitS * 1000);
        if (this.#clock() >= waitUntil) break;
        op = await waiter.wait(this.client, op.id, { status, deadline: waitUntil });
        continue;
      }
      if (status === "compensating") {
        if (opts.undo === undefined || op.error_code === "compensation_failed") break;
        op = await this.#compensate(op, opts.undo, args);
        continue;
      }
      if (status === "awaiting_approval") {
        if (this.#clock() >= approvalDeadline) {
          result.refusal = ApprovalRequired.code;
          break;
        }
        op = await waiter.wait(this.client, op.id, { status, deadline: approvalDeadline });
        continue;
      }
      // ready, or executing under a lease this call does not hold
      try {
        claimSent = this.#clock();
        attempt = await this.client.claim(op.id, { leaseS: this.leaseS });
        conflicts = 0;
      } catch (error) {
        if (error instanceof RetryLater || error instanceof AttemptInProgress) {
          const wait = error.retryAfterMs ?? 1000;
          if (this.#clock() + wait > deadline) {
            result.refusal = error.code;
            op = await this.client.getOperation(op.id);
            break;
          }
          await this.#sleep(wait);
        } else if (error instanceof ConcurrencyConflict) {
          const [low, high] = this.conflictBackoffS;
          const wait = Math.random() * Math.min(high, low * 2 ** conflicts) * 1000;
          conflicts += 1;
          if (this.#clock() + wait > deadline) {
            result.refusal = error.code;
            op = await this.client.getOperation(op.id);
            break;
          }
          await this.#sleep(wait);
        } else if (
          error instanceof Superseded ||
          error instanceof OperationClosed ||
          error instanceof ReconciliationRequired ||
          error instanceof CompensationRequired ||
          error instanceof ApprovalRequired ||
          error instanceof GrantInvalid ||
          error instanceof BudgetExhausted
        ) {
          // The refusal says where the operation is (grant_invalid and budget_exhausted
          // moved it there); the loop acts on the state it reads.
          op = await this.client.getOperation(op.id);
        } else {
          throw error;
        }
      }
    }
    // An outcome's answer carries the envelope for the state it left (docs/api.md): when
    // the call ended there, no further request; otherwise ask for it now.
    const { tool_result: carried, ...operation } = op;
    result.operation = operation;
    result.envelope =
      carried === undefined || !TERMINAL.has(operation.status)
        ? await this.client.toolResult(operation.id)
        : carried;
    return result;
  }

  async #runAttempt<T>(
    op: Operation,
    attempt: Attempt,
    call: ToolFunction<T>,
    args: Record<string, unknown>,
    result: ToolCallResult<T>,
    claimSent: number,
  ): Promise<Operation> {
    const number = attempt.attempt;
    if (this.#clock() - claimSent > (this.leaseS - this.leaseMarginS) * 1000) {
      // The claim took so long to come back that the lease may be over by the time the
      // request reaches the outside world: a probe could then find nothing while the
      // request is still on its way. Do not send it.
      return this.#postOutcome(op, number, {
        kind: "failed",
        code: "not_sent",
        detail: "The lease was about to expire before the call started.",
      });
    }
    const heartbeat = new Heartbeat(
      this.client,
      op.id,
      number,
      this.leaseS,
      this.heartbeatEveryS * 1000,
      this.#log,
    );
    const context: AttemptContext = {
      operationId: op.id,
      attempt: number,
      idempotencyKey: attempt.idempotency_key,
      arguments: args,
      leaseUntil: attempt.lease_until,
      signal: heartbeat.signal,
    };
    let body: Record<string, unknown>;
    heartbeat.start();
    try {
      const value = await call(context);
      const success = value instanceof Succeeded ? value : new Succeeded({ result: value });
      body = success.body();
      result.output = value;
      if (!travels(body)) {
        // The effect happened: record it even if its result cannot travel (Effectgate
        // refuses what not every JSON reader reads the same).
        body["result"] = { repr: describeValue(success.result).replaceAll("\u0000", "").slice(0, 4000) };
      }
    } catch (error) {
      if (error instanceof ToolOutcome) {
        body = error.body();
      } else {
        // Whatever went wrong, the request may have left: unknown, never "failed".
        const detail = exceptionDetail(error);
        this.#log(`tool call ${op.id} #${number} threw: ${detail}`);
        body = { kind: "unknown", code: "runner_exception", detail };
      }
    } finally {
      await heartbeat.stop();
    }
    return this.#postOutcome(op, number, body);
  }

  async #postOutcome(
    op: Operation,
    number: number,
    body: Record<string, unknown>,
  ): Promise<Operation> {
    try {
      return await this.client.postOutcome(op.id, number, body);
    } catch (error) {
      if (error instanceof StaleAttempt || error instanceof OutcomeConflict) {
        // Recorded as a late outcome (a late success still applies) or refused because
        // the attempt already has another outcome; the operation says which.
        return this.client.getOperation(op.id);
      }
      // Unreachable, or still answering a status worth repeating (a 429 or 5xx) after
      // every repeat: the outcome is not recorded, and the caller keeps it to post later.
      const lastAnswer =
        (error instanceof ProblemError || error instanceof UnexpectedResponse) &&
        RETRY_STATUSES.has(error.status);
      if (error instanceof TransportError || lastAnswer) {
        throw new OutcomeNotRecorded(
          `the outcome of ${op.id} attempt ${number} could not be posted: ${error.message}`,
          {
            operationId: op.id,
            attempt: number,
            outcome: body,
            requestId: (error as TransportError | ProblemError | UnexpectedResponse).requestId,
            cause: error,
          },
        );
      }
      throw error;
    }
  }

  async #compensate(
    op: Operation,
    undo: ToolFunction<unknown>,
    args: Record<string, unknown>,
  ): Promise<Operation> {
    const context: AttemptContext = {
      operationId: op.id,
      attempt: op.attempts,
      idempotencyKey: `${op.idempotency_key}:undo`,
      arguments: args,
      leaseUntil: "",
      signal: new AbortController().signal,
    };
    let evidence: unknown;
    try {
      evidence = await undo(context);
    } catch (error) {
      const detail = exceptionDetail(error);
      this.#log(`undo of ${op.id} failed: ${detail}`);
      return this.client.compensate(op.id, { result: "failed", evidence: { error: detail } });
    }
    return this.client.compensate(op.id, {
      result: "committed",
      evidence:
        evidence !== null && typeof evidence === "object" && !Array.isArray(evidence)
          ? (evidence as Record<string, unknown>)
          : { result: evidence ?? null },
    });
  }
}

function describeValue(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

/** Extends an attempt's lease on a timer until stopped; aborts `signal` when the lease
 * was lost. One beat at a time: a slow answer delays the next beat, never doubles it. */
class Heartbeat {
  beats = 0;
  stale = false;
  readonly #controller = new AbortController();
  #timer: ReturnType<typeof setInterval> | undefined;
  #inFlight: Promise<void> | null = null;

  constructor(
    private readonly client: EffectgateClient,
    private readonly operationId: string,
    private readonly attempt: number,
    private readonly leaseS: number,
    private readonly everyMs: number,
    private readonly log: (message: string) => void,
  ) {}

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  start(): void {
    this.#timer = setInterval(() => {
      if (this.#inFlight === null && !this.stale) this.#inFlight = this.#beat();
    }, this.everyMs);
  }

  async #beat(): Promise<void> {
    try {
      // One repeat at most: the next beat is a repeat too.
      await this.client.heartbeat(this.operationId, this.attempt, {
        leaseS: this.leaseS,
        maxRetries: 1,
      });
      this.beats += 1;
    } catch (error) {
      if (error instanceof StaleAttempt) {
        // Something acted on the expired lease (a paused process, a long pause): the
        // outcome will be recorded as a late outcome.
        this.stale = true;
        this.log(`attempt ${this.operationId} #${this.attempt} lost its lease`);
        this.#controller.abort(error);
        clearInterval(this.#timer);
      } else if (error instanceof EffectgateError) {
        this.log(`heartbeat of ${this.operationId} failed: ${error.message}`);
      } else {
        this.log(`heartbeat of ${this.operationId} failed: ${String(error)}`);
      }
    } finally {
      this.#inFlight = null;
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    // A beat in flight finishes before the outcome is posted (its answer cannot then
    // reorder with the outcome's).
    if (this.#inFlight !== null) await this.#inFlight;
  }
}
