// What the framework guards share: operation keys, the envelope a model reads when
// Runner.execute could not answer one, and results made storable. Not a public entry
// point: the guards import it.
import { AsyncLocalStorage } from "node:async_hooks";
import { createHash } from "node:crypto";

import { EffectgateError, OutcomeNotRecorded, ProblemError, TransportError } from "./index.js";
import type { AttemptContext, EffectgateClient, Operation, ToolContract } from "./index.js";

const attempts = new AsyncLocalStorage<AttemptContext>();

/** The Effectgate attempt the running guarded tool serves (its `idempotencyKey` is the
 * one to pass to the provider), or undefined outside a guarded call. */
export function currentAttempt(): AttemptContext | undefined {
  return attempts.getStore();
}

/** Runs `fn` as the tool function of `attempt`: `currentAttempt()` answers it inside. */
export function inAttempt<T>(attempt: AttemptContext, fn: () => Promise<T>): Promise<T> {
  return attempts.run(attempt, fn);
}

/** The JSON envelope a model reads for every guarded call (the keys of
 * `GET /operations/{id}/tool-result`, plus `result` once it succeeded). */
export type Envelope = {
  status: string;
  code: string | null;
  logical_operation_id: string | null;
  message: string;
  allowed_next_actions: string[];
  [key: string]: unknown;
};

// Effectgate's limit on operation_key.
const MAX_KEY_LENGTH = 255;

/**
 * The RFC 8785 canonical form of a JSON value: object members sorted by their names'
 * UTF-16 code units, numbers and strings as ECMAScript's JSON.stringify writes them
 * (which is what RFC 8785 specifies). Arguments that are one intent to Effectgate
 * (`500` and `500.0`, keys in any order) give one text.
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value === "boolean" || typeof value === "string") {
    return JSON.stringify(value);
  }
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new TypeError("no canonical form for a non-finite number");
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) {
    return `[${value.map((item) => (item === undefined ? "null" : canonicalJson(item))).join(",")}]`;
  }
  if (typeof value === "object") {
    const record = value as Record<string, unknown>;
    const names = Object.keys(record)
      .filter((name) => record[name] !== undefined)
      .sort();
    return `{${names.map((name) => `${JSON.stringify(name)}:${canonicalJson(record[name])}`).join(",")}}`;
  }
  throw new TypeError(`no JSON form for a ${typeof value}`);
}

/** An operation key from what identifies one intended call: the parts hashed in their
 * canonical form, so the same parts always give the same key. */
export function derivedKey(...parts: unknown[]): string {
  return "eg:" + createHash("sha256").update(canonicalJson(parts)).digest("hex").slice(0, 40);
}

/** The key of a framework tool call: the run, the tool and the call id the framework
 * gave the call (never anything the model wrote into the arguments). Readable when it
 * fits Effectgate's limit, hashed otherwise. */
export function callKey(run: string, tool: string, callId: string): string {
  const key = `${run}:${tool}:${callId}`;
  return key.length <= MAX_KEY_LENGTH ? key : derivedKey(run, tool, callId);
}

/** Registers a tool's contract once per guard (`PUT /tools/{name}`), before its first
 * call; a refused contract fails that call loudly rather than running unguarded. */
export function contractRegistrar(
  client: EffectgateClient,
  name: string,
  contract: ToolContract | undefined,
): () => Promise<void> {
  let registered: Promise<void> | undefined;
  return () => {
    if (contract === undefined) return Promise.resolve();
    registered ??= client.putTool(name, contract).then(
      () => undefined,
      (error: unknown) => {
        registered = undefined; // the next call tries again
        throw error;
      },
    );
    return registered;
  };
}

/** The console page where a person decides on the operation's approval, if it has one. */
export function approvalUrl(baseUrl: string, operation: Operation): string | null {
  const approval = (operation as { approval?: { id?: string } | null }).approval;
  if (!approval?.id) return null;
  return `${baseUrl.replace(/\/+$/, "")}/approvals/${approval.id}/`;
}

/** What the model reads when the tool ran but Effectgate did not hear how it ended: the
 * effect may exist, so the model must not make the call again as a new one. */
export function unrecordedEnvelope(tool: string, operationId: string | null): Envelope {
  return {
    status: "outcome_unknown",
    code: "outcome_not_recorded",
    logical_operation_id: operationId,
    message:
      `The call to ${tool} was made, but its outcome could not be recorded; ` +
      "it is being reconciled. Do not retry it.",
    allowed_next_actions: ["reconcile"],
  };
}

/** What the model reads when Effectgate refused the call or could not be reached
 * before anything ran: the envelope's shape, so the model sees one kind of answer. */
export function refusalEnvelope(error: unknown, tool: string): Envelope {
  if (error instanceof ProblemError) {
    const problem = (error.problem ?? {}) as Record<string, unknown>;
    const errors = problem["errors"];
    return {
      status: "refused",
      code: error.code,
      logical_operation_id: typeof problem["operation"] === "string" ? problem["operation"] : null,
      message: error.detail || error.title || error.message,
      allowed_next_actions: [],
      ...(Array.isArray(errors) && errors.length ? { errors } : {}),
    };
  }
  if (error instanceof TransportError) {
    return {
      status: "refused",
      code: "effectgate_unreachable",
      logical_operation_id: null,
      message:
        `The call to ${tool} was not made: Effectgate could not be reached. ` +
        "Try again later with the same arguments.",
      allowed_next_actions: [],
    };
  }
  const text = error instanceof Error ? error.message : String(error);
  return {
    status: "refused",
    code: "effectgate_error",
    logical_operation_id: null,
    message: `The call to ${tool} was not made: ${text}`,
    allowed_next_actions: [],
  };
}

/** The envelope for an error out of Runner.execute: before the tool ran, a refusal;
 * after it ran, an unknown outcome (never "not made"). Errors that are not Effectgate's
 * and came before the call are the caller's bug: thrown again. */
export function guardedEnvelope(error: unknown, tool: string, called: boolean): Envelope {
  if (error instanceof OutcomeNotRecorded) return unrecordedEnvelope(tool, error.operationId);
  if (called) return unrecordedEnvelope(tool, null);
  if (error instanceof EffectgateError) return refusalEnvelope(error, tool);
  throw error;
}

/** What a tool returned, as JSON Effectgate can store (its text otherwise). */
export function jsonable(value: unknown): unknown {
  if (value === undefined) return null;
  try {
    const text = JSON.stringify(value);
    return text === undefined ? String(value) : (JSON.parse(text) as unknown);
  } catch {
    return String(value);
  }
}

/** The last value of a tool's answer: AI SDK tools may stream preliminary results. */
export async function settled(value: unknown): Promise<unknown> {
  const resolved = await value;
  if (resolved !== null && typeof resolved === "object" && Symbol.asyncIterator in resolved) {
    let last: unknown = undefined;
    for await (const item of resolved as AsyncIterable<unknown>) last = item;
    return last;
  }
  return resolved;
}
