// The Vercel AI SDK (`ai`, version 7): `guard(tool, {...})` makes a `tool()` whose
// `execute` goes through Effectgate's Runner.execute and whose pending approvals use the
// SDK's own tool-approval flow.
//
// A call to a guarded tool:
//   1. `needsApproval` registers the operation (key: the run, the tool's name and the
//      SDK's toolCallId; never anything the model wrote) and answers true while
//      Effectgate waits for a person. generateText / streamText then stop with a
//      `tool-approval-request` part instead of running the tool.
//   2. Once the person decided in Effectgate, `approvalResponses(messages, tools)`
//      answers those requests (a `tool` message of `tool-approval-response` parts):
//      approved -> the SDK runs `execute`; rejected -> the SDK sends the model an
//      `execution-denied` result whose reason is Effectgate's sentence (with the
//      reviewer's comment). Undecided requests are listed in `pending`, with the page.
//   3. `execute` runs the tool inside an Effectgate attempt (register, claim, heartbeat,
//      outcome) and answers the model Effectgate's envelope (`status`, `code`,
//      `message`, `allowed_next_actions`, and `result` once it succeeded). A replayed
//      call (same run and toolCallId) answers the recorded outcome without calling the
//      tool again.
import type { InferToolInput, ModelMessage, Tool, ToolApprovalResponse, ToolModelMessage, ToolSet } from "ai";

import {
  approvalUrl,
  callKey,
  contractRegistrar,
  currentAttempt,
  guardedEnvelope,
  inAttempt,
  jsonable,
  settled,
  type Envelope,
} from "./_guard.js";
import { EffectgateError } from "./index.js";
import type { AttemptContext, Operation, Runner, ToolContract } from "./index.js";

export { currentAttempt, type Envelope };

/** How the guard names one call's operation. */
export type OperationKeyFunction = (call: {
  run: string;
  tool: string;
  toolCallId: string;
  input: unknown;
}) => string;

export interface GuardOptions {
  /** The Runner (and through it the client) that talks to Effectgate. */
  runner: Runner;
  /** The Effectgate run the calls belong to (one per conversation; keep its id with the
   * conversation so that a resumed conversation finds its operations again). */
  run: string;
  /** The tool's name: its key in the ToolSet given to generateText / streamText. */
  name: string;
  /** Registered as the tool's contract before its first call (`PUT /tools/{name}`). */
  contract?: ToolContract;
  /** Default: `${run}:${name}:${toolCallId}`. */
  operationKey?: OperationKeyFunction;
  /** How long `execute` waits for a person when it finds the call still undecided
   * (the app approved in the SDK before Effectgate decided). Default 0: it answers
   * `awaiting_approval` at once. */
  approvalWaitS?: number;
}

/** An approval request of the SDK that waits for a person in Effectgate. */
export interface PendingApproval {
  approvalId: string;
  toolCallId: string;
  toolName: string;
  operation: string;
  approval: string | null;
  approvalUrl: string | null;
}

interface Guarded {
  options: GuardOptions;
  key(toolCallId: string, input: unknown): string;
}

const guards = new WeakMap<object, Guarded>();

// A tool of any input; the guarded one answers the envelope.
type AnyTool = Tool<any, any, any>;

/** A guarded tool: the input of the tool it wraps, Effectgate's envelope as output. */
export type GuardedTool<T extends AnyTool> = Tool<InferToolInput<T>, Envelope>;

/** `tool` guarded by Effectgate; its output is Effectgate's envelope. */
export function guard<T extends AnyTool>(tool: T, options: GuardOptions): GuardedTool<T> {
  const inner = tool as AnyTool & {
    execute?: (input: unknown, opts: Record<string, unknown>) => unknown;
    needsApproval?: boolean | ((input: unknown, opts: Record<string, unknown>) => unknown);
  };
  if (typeof inner.execute !== "function") {
    throw new TypeError(`guard: the tool ${options.name} has no execute function to guard`);
  }
  const innerExecute = inner.execute.bind(inner);
  const { runner, run, name } = options;
  const client = runner.client;
  const ensureContract = contractRegistrar(client, name, options.contract);
  const key = (toolCallId: string, input: unknown): string =>
    options.operationKey
      ? options.operationKey({ run, tool: name, toolCallId, input })
      : callKey(run, name, toolCallId);

  async function effectgateNeedsApproval(input: unknown, toolCallId: string): Promise<boolean> {
    await ensureContract();
    try {
      const operation = await client.register({
        run,
        tool: name,
        operation_key: key(toolCallId, input),
        arguments: input as Record<string, unknown>,
        call_id: toolCallId,
      });
      return operation.status === "awaiting_approval";
    } catch (error) {
      // A refusal (budget, arguments): execute meets it again and tells the model.
      if (error instanceof EffectgateError) return false;
      throw error;
    }
  }

  const guarded = {
    ...tool,
    needsApproval: async (input: unknown, opts: { toolCallId: string } & Record<string, unknown>) => {
      // The tool's own approval (if any) still applies; Effectgate's is added to it.
      const own =
        typeof inner.needsApproval === "function"
          ? Boolean(await inner.needsApproval(input, opts))
          : inner.needsApproval === true;
      return (await effectgateNeedsApproval(input, opts.toolCallId)) || own;
    },
    execute: async (input: unknown, opts: { toolCallId: string; abortSignal?: AbortSignal } & Record<string, unknown>) => {
      await ensureContract();
      let called = false;
      try {
        const result = await runner.execute({
          run,
          tool: name,
          operationKey: key(opts.toolCallId, input),
          arguments: input as Record<string, unknown>,
          callId: opts.toolCallId,
          approvalWaitS: options.approvalWaitS ?? 0,
          call: async (attempt: AttemptContext) => {
            called = true;
            const signal = opts.abortSignal ? AbortSignal.any([opts.abortSignal, attempt.signal]) : attempt.signal;
            const output = await inAttempt(attempt, () =>
              settled(innerExecute(attempt.arguments, { ...opts, abortSignal: signal })),
            );
            return jsonable(output);
          },
        });
        return result.forModel() as Envelope;
      } catch (error) {
        return guardedEnvelope(error, name, called);
      }
    },
  } as Record<string, unknown>;
  // The envelope replaces the tool's own output: its output schema and conversion no
  // longer describe what the model reads.
  delete guarded["outputSchema"];
  delete guarded["toModelOutput"];
  guards.set(guarded, { options, key });
  return guarded as unknown as GuardedTool<T>;
}

/** Every tool of `tools` guarded with the same runner and run (each under its key). */
export function guardTools<T extends ToolSet>(
  tools: T,
  options: Omit<GuardOptions, "name" | "contract"> & { contracts?: Partial<Record<keyof T, ToolContract>> },
): { [K in keyof T]: GuardedTool<T[K]> } {
  const { contracts, ...shared } = options;
  const guarded: Record<string, AnyTool> = {};
  for (const [name, tool] of Object.entries(tools)) {
    const contract = contracts?.[name as keyof T];
    guarded[name] = guard(tool as AnyTool, { ...shared, name, ...(contract ? { contract } : {}) });
  }
  return guarded as { [K in keyof T]: GuardedTool<T[K]> };
}

type Part = { type: string; [key: string]: unknown };

function parts(message: ModelMessage): Part[] {
  return Array.isArray(message.content) ? (message.content as Part[]) : [];
}

/**
 * Answers the SDK's approval requests of guarded tools that a person has decided in
 * Effectgate. `message` is a `tool` message to append to `messages` before calling
 * generateText / streamText again (null when nothing was decided); `pending` lists the
 * requests still waiting, with the console page where a person decides. Requests of
 * tools that are not guarded, or that the tool's own `needsApproval` raised, are left
 * for the app to answer.
 */
export async function approvalResponses(
  messages: ModelMessage[],
  tools: ToolSet,
): Promise<{ message: ToolModelMessage | null; pending: PendingApproval[] }> {
  const calls = new Map<string, { toolName: string; input: unknown }>();
  const requests: { approvalId: string; toolCallId: string }[] = [];
  const answered = new Set<string>();
  for (const message of messages) {
    for (const part of parts(message)) {
      if (part.type === "tool-call") {
        calls.set(String(part["toolCallId"]), { toolName: String(part["toolName"]), input: part["input"] });
      } else if (part.type === "tool-approval-request") {
        requests.push({ approvalId: String(part["approvalId"]), toolCallId: String(part["toolCallId"]) });
      } else if (part.type === "tool-approval-response") {
        answered.add(String(part["approvalId"]));
      }
    }
  }
  const responses: ToolApprovalResponse[] = [];
  const pending: PendingApproval[] = [];
  for (const request of requests) {
    if (answered.has(request.approvalId)) continue;
    const call = calls.get(request.toolCallId);
    const tool = call ? tools[call.toolName] : undefined;
    const state = tool ? guards.get(tool) : undefined;
    if (!call || !state) continue;
    const { runner, run, name } = state.options;
    // The same registration as the call's: Effectgate answers the same operation.
    const operation: Operation = await runner.client.register({
      run,
      tool: name,
      operation_key: state.key(request.toolCallId, call.input),
      arguments: call.input as Record<string, unknown>,
      call_id: request.toolCallId,
    });
    const approval = (operation as { approval?: { id?: string; status?: string } | null }).approval;
    if (!approval) continue; // not Effectgate's request: the app answers it
    if (operation.status === "awaiting_approval") {
      pending.push({
        approvalId: request.approvalId,
        toolCallId: request.toolCallId,
        toolName: call.toolName,
        operation: operation.id,
        approval: approval.id ?? null,
        approvalUrl: approvalUrl(runner.client.baseUrl, operation),
      });
    } else if (approval.status === "approved" || operation.status === "superseded") {
      // Approved, perhaps with changes (the operation is then superseded by an edited
      // copy, which execute runs with the person's arguments).
      responses.push({ type: "tool-approval-response", approvalId: request.approvalId, approved: true, reason: "Approved in Effectgate." });
    } else {
      // Rejected, expired or revoked: the model reads Effectgate's sentence for it.
      const envelope = await runner.client.toolResult(operation.id);
      responses.push({
        type: "tool-approval-response",
        approvalId: request.approvalId,
        approved: false,
        reason: String((envelope as { message?: unknown }).message ?? `The call to ${name} was not approved.`),
      });
    }
  }
  return { message: responses.length ? { role: "tool", content: responses } : null, pending };
}
