// The OpenAI Agents SDK for JavaScript (`@openai/agents`): `guard(tool, {...})` turns a
// FunctionTool into one whose every invocation goes through Effectgate's
// Runner.execute, keyed by the model's call id, and whose pending approvals are the
// SDK's own interruptions.
//
// A call to a guarded tool:
//   1. `needsApproval` registers the operation (key: the run, the tool's name and the
//      call id) and answers true while Effectgate waits for a person: the run stops
//      with an interruption (`result.interruptions`), and `result.state` can be kept
//      (`state.toString()`) across a restart. `approvalRequest(item)` names the
//      Effectgate approval and its console page.
//   2. A person decides in Effectgate (console, Slack, API). Resuming the run
//      (`run(agent, state)`) asks Effectgate again: still undecided, it interrupts
//      again and nothing runs; decided, the tool runs, once, inside an Effectgate
//      attempt (approved), or the model reads the rejection with the reviewer's
//      comment. There is nothing to approve in the SDK: Effectgate holds the decision.
//   3. The model reads Effectgate's envelope as the tool's output (`status`, `code`,
//      `message`, `allowed_next_actions`, and `result` once it succeeded). A run that
//      repeats a call it already made gets the recorded outcome back.
import { type FunctionTool, ModelBehaviorError, type RunContext, type RunToolApprovalItem } from "@openai/agents";

import {
  approvalUrl,
  callKey,
  contractRegistrar,
  currentAttempt,
  derivedKey,
  guardedEnvelope,
  inAttempt,
  jsonable,
  type Envelope,
} from "./_guard.js";
import { EffectgateError, Failed, Unknown } from "./index.js";
import type { AttemptContext, Runner, ToolContract } from "./index.js";

export { currentAttempt, type Envelope };

/** The text the SDK's default error function puts in place of a tool's error: a guarded
 * tool that answers it raised an error the SDK turned into text (create the tool with
 * `errorFunction: null`); it is posted as unknown, never as a success. */
const SDK_DEFAULT_ERROR_TEXT = "An error occurred while running the tool. Please try again.";

export type OperationKeyFunction = (call: {
  run: string;
  tool: string;
  callId: string | undefined;
  arguments: Record<string, unknown>;
}) => string;

export interface GuardOptions<TContext = unknown> {
  runner: Runner;
  /** The Effectgate run id, or a function of the run context that answers it. */
  run: string | ((runContext: RunContext<TContext>) => string);
  /** Registered as the tool's contract before its first call (`PUT /tools/{name}`). */
  contract?: ToolContract;
  /** Default: `${run}:${tool}:${callId}`. */
  operationKey?: OperationKeyFunction;
  /** How long one invocation may wait for a person when it finds the call undecided
   * (it was approved in the SDK before Effectgate decided). Default 0. */
  approvalWaitS?: number;
}

/** The Effectgate side of an interruption raised by a guarded tool. */
export interface ApprovalRequest {
  tool: string;
  callId: string;
  operation: string;
  approval: string | null;
  approvalUrl: string | null;
  message: string;
}

// What needsApproval learnt, by call id, for approvalRequest(); bounded.
const MAX_REMEMBERED = 1000;
const requests = new Map<string, ApprovalRequest>();

function remember(request: ApprovalRequest): void {
  requests.delete(request.callId);
  requests.set(request.callId, request);
  if (requests.size > MAX_REMEMBERED) {
    const oldest = requests.keys().next().value;
    if (oldest !== undefined) requests.delete(oldest);
  }
}

/** The Effectgate approval an interruption of a guarded tool waits for (known once the
 * guard asked Effectgate in this process; resuming the run asks again). */
export function approvalRequest(item: RunToolApprovalItem): ApprovalRequest | undefined {
  const raw = item.rawItem as { callId?: string };
  return raw.callId ? requests.get(raw.callId) : undefined;
}

/** The call's arguments as Effectgate registers them: the model's JSON, parsed. The
 * approval check and the invocation must register the same ones (one intent): the SDK
 * hands the copy's needsApproval the JSON parsed (the copy's invoke has no SDK parser),
 * and its invoke the JSON text. */
function callArguments(input: unknown): Record<string, unknown> {
  const parsed: unknown = typeof input === "string" ? (input ? JSON.parse(input) : {}) : (input ?? {});
  return parsed !== null && typeof parsed === "object" && !Array.isArray(parsed)
    ? (parsed as Record<string, unknown>)
    : { input: parsed };
}

/**
 * A copy of `tool` that Effectgate guards. Create the tool with `errorFunction: null`
 * (an error turned into text would look like a success) and without `timeoutMs` (the
 * SDK would stop waiting while the call goes on; the attempt's lease covers a hang).
 */
export function guard<T extends FunctionTool<any, any, any>>(tool: T, options: GuardOptions<any>): T {
  if (tool.type !== "function") throw new TypeError("guard: not a function tool");
  if (tool.timeoutMs !== undefined) {
    throw new TypeError(
      `guard: ${tool.name} has timeoutMs: a guarded tool has no SDK timeout (the SDK would ` +
        "stop waiting while the call goes on; the attempt's lease covers a hang)",
    );
  }
  const { runner } = options;
  const name = tool.name;
  const client = runner.client;
  const ensureContract = contractRegistrar(client, name, options.contract);
  const runOf = (ctx: RunContext<any>): string => (typeof options.run === "function" ? options.run(ctx) : options.run);
  const keyOf = (run: string, callId: string | undefined, args: Record<string, unknown>): string =>
    options.operationKey
      ? options.operationKey({ run, tool: name, callId, arguments: args })
      : callId
        ? callKey(run, name, callId)
        : derivedKey("openai-agents", run, name, args);
  const innerInvoke = tool.invoke.bind(tool);
  const innerNeedsApproval = tool.needsApproval.bind(tool);

  async function needsApproval(ctx: RunContext<any>, input: unknown, callId?: string): Promise<boolean> {
    const own = await innerNeedsApproval(ctx, input as never, callId);
    await ensureContract();
    const run = runOf(ctx);
    let args: Record<string, unknown>;
    try {
      args = callArguments(input);
    } catch {
      return own; // not JSON: the SDK answers the model itself
    }
    try {
      const operation = await client.register({
        run,
        tool: name,
        operation_key: keyOf(run, callId, args),
        arguments: args,
        ...(callId ? { call_id: callId } : {}),
      });
      if (operation.status !== "awaiting_approval") return own;
      const approval = (operation as { approval?: { id?: string } | null }).approval;
      if (callId) {
        remember({
          tool: name,
          callId,
          operation: operation.id,
          approval: approval?.id ?? null,
          approvalUrl: approvalUrl(client.baseUrl, operation),
          message: `The call to ${name} is waiting for a person to approve it in Effectgate.`,
        });
      }
      return true;
    } catch (error) {
      // A refusal (budget, arguments): the invocation meets it again and tells the model.
      if (error instanceof EffectgateError) return own;
      throw error;
    }
  }

  async function invoke(ctx: RunContext<any>, input: string, details?: { toolCall?: { callId?: string } }): Promise<string> {
    await ensureContract();
    const run = runOf(ctx);
    const callId = details?.toolCall?.callId;
    let called = false;
    let envelope: Envelope;
    try {
      const args = callArguments(input);
      const result = await runner.execute({
        run,
        tool: name,
        operationKey: keyOf(run, callId, args),
        arguments: args,
        ...(callId ? { callId } : {}),
        approvalWaitS: options.approvalWaitS ?? 0,
        call: async (attempt: AttemptContext) => {
          called = true;
          let output: unknown;
          try {
            output = await inAttempt(attempt, () =>
              innerInvoke(ctx, JSON.stringify(attempt.arguments), details as never),
            );
          } catch (error) {
            // The tool's own parameters refused the arguments: it never ran. The SDK does
            // not export InvalidToolInputError itself; it is a ModelBehaviorError, and
            // only the SDK's own class counts (a tool's error of the same name does not).
            if (isInvalidToolInput(error)) {
              throw new Failed("invalid_tool_input", `${name}: ${error.message}`);
            }
            throw error;
          }
          if (output === SDK_DEFAULT_ERROR_TEXT) {
            throw new Unknown("tool_error_as_text", `${name} raised an error that the SDK's errorFunction turned into text`);
          }
          return jsonable(output);
        },
      });
      envelope = result.forModel() as Envelope;
    } catch (error) {
      envelope = guardedEnvelope(error, name, called);
    }
    if (callId) requests.delete(callId);
    return JSON.stringify(envelope);
  }

  const copy = Object.create(Object.getPrototypeOf(tool), Object.getOwnPropertyDescriptors(tool)) as T;
  Object.assign(copy, { invoke, needsApproval, timeoutMs: undefined });
  return copy;
}

/** Whether `error` is the SDK's InvalidToolInputError (its parameters refused the
 * model's arguments before the tool ran): an instance of the SDK's exported
 * ModelBehaviorError whose class is the SDK's InvalidToolInputError. */
export function isInvalidToolInput(error: unknown): error is ModelBehaviorError {
  return error instanceof ModelBehaviorError && error.constructor.name === "InvalidToolInputError";
}
