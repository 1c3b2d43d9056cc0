// The MCP TypeScript SDK (`@modelcontextprotocol/sdk`): `guardClient(client, {...})`
// answers a Client whose every `callTool` goes through Effectgate's Runner.execute, for
// agents that talk to MCP servers themselves rather than through `effectgate-mcp`.
//
// The semantics are the gateway's (docs/integrations.md): the operation key is the
// caller's `_meta["effectgate/operation_key"]`, else one derived from the run, the tool
// and the RFC 8785 canonical arguments (the same call made again is the same operation;
// a call meant twice gives each its own key); the server receives
// `_meta["effectgate/idempotency_key"]` and `_meta["effectgate/operation_id"]`; an
// `isError` answer is `failed` only with a `_meta["effectgate/error_code"]`, else
// `unknown`; the answer is a CallToolResult: the server's content followed by the
// envelope as JSON text on success, `isError: true` with the envelope otherwise, and the
// envelope in `_meta["effectgate/envelope"]` always.
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";

import {
  approvalUrl,
  contractRegistrar,
  currentAttempt,
  derivedKey,
  guardedEnvelope,
  inAttempt,
  type Envelope,
} from "./_guard.js";
import { Failed, NotSent, Unknown } from "./index.js";
import type { AttemptContext, Operation, Runner, ToolContract } from "./index.js";

export { currentAttempt, type Envelope };

export const OPERATION_KEY_META = "effectgate/operation_key";
export const IDEMPOTENCY_KEY_META = "effectgate/idempotency_key";
export const OPERATION_ID_META = "effectgate/operation_id";
export const ERROR_CODE_META = "effectgate/error_code";
export const ENVELOPE_META = "effectgate/envelope";

const OUTCOME_CODE = /^[a-z0-9_.:-]{1,64}$/;
// The result kept in Effectgate for replays; a larger answer keeps only a note.
const MAX_STORED_RESULT_BYTES = 256 * 1024;
// JSON-RPC codes that say the server refused the request itself: the tool never ran.
const METHOD_NOT_FOUND = -32601;
const INVALID_PARAMS = -32602;
const REQUEST_TIMEOUT = -32001;
const CONNECTION_CLOSED = -32000;

export interface GuardClientOptions {
  runner: Runner;
  /** The Effectgate run the calls belong to. */
  run: string;
  /** Contracts registered before each tool's first call (`PUT /tools/{name}`). Every
   * call goes through Effectgate, listed or not: a tool Effectgate does not know is
   * refused (`unknown_tool`), never called unguarded. */
  contracts?: Record<string, ToolContract>;
  /** How long one call may wait for a person (and for backoff). Default 0: a call
   * that needs approval answers at once with the page; calling it again with the same
   * arguments once approved runs it. */
  approvalWaitS?: number;
}

type CallParams = Parameters<Client["callTool"]>[0];
type CallRest = Parameters<Client["callTool"]> extends [unknown, ...infer R] ? R : never;

function textOf(result: CallToolResult): string {
  return (result.content ?? [])
    .map((block) => (block.type === "text" ? block.text : ""))
    .filter(Boolean)
    .join(" ");
}

/** An `isError` answer: failed only when the server says which error (its way of saying
 * nothing was committed); an SDK server turns any exception into `isError`, also one
 * thrown after the effect, so without a code it is unknown. */
function upstreamFailure(result: CallToolResult): Error {
  const code = (result._meta ?? {})[ERROR_CODE_META];
  const detail = textOf(result).slice(0, 4000) || "the server answered an error";
  if (typeof code !== "string" || !OUTCOME_CODE.test(code)) {
    return new Unknown("upstream_error_unknown", detail);
  }
  return new Failed(code === "not_sent" ? "upstream_not_sent" : code, detail);
}

/** A thrown error of `callTool`, as what happened to the call. */
function callFailure(error: unknown, tool: string): Error {
  const code = (error as { code?: unknown })?.code;
  const message = error instanceof Error ? error.message : String(error);
  if (typeof code === "number") {
    if (code === METHOD_NOT_FOUND || code === INVALID_PARAMS) {
      return new Failed("upstream_refused", `${tool}: ${message}`);
    }
    if (code === REQUEST_TIMEOUT) return new Unknown("timeout_unknown", `${tool}: ${message}`);
    if (code === CONNECTION_CLOSED) return new Unknown("connection_lost", `${tool}: ${message}`);
  }
  // The SDK refuses to send without a transport.
  if (message === "Not connected") return new NotSent(`${tool}: the client is not connected`);
  return new Unknown("upstream_call_unknown", `${tool}: ${message}`);
}

/** What Effectgate keeps of a successful answer, for a replay to answer again. */
function storedResult(result: CallToolResult): Record<string, unknown> {
  const stored = { content: result.content ?? [], structuredContent: result.structuredContent ?? null };
  const size = Buffer.byteLength(JSON.stringify(stored));
  if (size <= MAX_STORED_RESULT_BYTES) return stored;
  return {
    content: [{ type: "text", text: `(the server's answer, ${size} bytes of JSON, was too large to keep)` }],
    structuredContent: null,
    truncated: true,
  };
}

function answer(envelope: Envelope, upstream: CallToolResult | null): CallToolResult {
  const text = { type: "text" as const, text: JSON.stringify(envelope) };
  const _meta = { [ENVELOPE_META]: envelope };
  if (envelope.status === "succeeded" && upstream) {
    return {
      content: [...(upstream.content ?? []), text],
      ...(upstream.structuredContent ? { structuredContent: upstream.structuredContent } : {}),
      isError: false,
      _meta,
    };
  }
  return { content: [text], isError: true, _meta };
}

/** `client` with every `callTool` guarded by Effectgate (the other methods unchanged). */
export function guardClient<C extends Client>(client: C, options: GuardClientOptions): C {
  const { runner, run } = options;
  const registrars = new Map<string, () => Promise<void>>();
  const ensureContract = (name: string): Promise<void> => {
    let registrar = registrars.get(name);
    if (!registrar) {
      registrar = contractRegistrar(runner.client, name, options.contracts?.[name]);
      registrars.set(name, registrar);
    }
    return registrar();
  };
  const innerCallTool = client.callTool.bind(client);

  async function callTool(params: CallParams, ...rest: CallRest): Promise<CallToolResult> {
    const name = params.name;
    const args = (params.arguments ?? {}) as Record<string, unknown>;
    const { [OPERATION_KEY_META]: givenKey, ...meta } = (params._meta ?? {}) as Record<string, unknown>;
    await ensureContract(name);
    const operationKey = typeof givenKey === "string" && givenKey ? givenKey : derivedKey("mcp", run, name, args);
    let called = false;
    let upstream: CallToolResult | null = null;
    let envelope: Envelope;
    let operation: Operation | null = null;
    try {
      const result = await runner.execute({
        run,
        tool: name,
        operationKey,
        arguments: args,
        approvalWaitS: options.approvalWaitS ?? 0,
        call: async (attempt: AttemptContext) => {
          called = true;
          const [resultSchema, requestOptions] = rest;
          const request = {
            ...params,
            arguments: attempt.arguments,
            _meta: { ...meta, [IDEMPOTENCY_KEY_META]: attempt.idempotencyKey, [OPERATION_ID_META]: attempt.operationId },
          };
          let output: CallToolResult;
          try {
            output = (await inAttempt(attempt, () =>
              innerCallTool(request, resultSchema, { ...requestOptions, signal: requestOptions?.signal ? AbortSignal.any([requestOptions.signal, attempt.signal]) : attempt.signal }),
            )) as CallToolResult;
          } catch (error) {
            throw callFailure(error, name);
          }
          if (output.isError) throw upstreamFailure(output);
          upstream = output;
          return storedResult(output);
        },
      });
      envelope = { ...(result.forModel() as Envelope) };
      operation = result.operation;
    } catch (error) {
      return answer(guardedEnvelope(error, name, called), null);
    }
    if (envelope.status === "awaiting_approval" && operation) {
      const url = approvalUrl(runner.client.baseUrl, operation);
      if (url) envelope["approval_url"] = url;
      envelope["next_step"] =
        `A person has to approve this call${url ? ` at ${url}` : ""}; tell the user. Once it is ` +
        `approved, calling ${name} again with exactly the same arguments runs it (once); calling ` +
        "it before then only reports that it is still waiting.";
    }
    if (envelope.status !== "succeeded") return answer(envelope, null);
    if (upstream) return answer(envelope, upstream);
    // A replay of a call that succeeded earlier: answer what was kept.
    const kept = (operation?.result ?? {}) as { content?: CallToolResult["content"]; structuredContent?: Record<string, unknown> | null };
    return answer(envelope, {
      content: Array.isArray(kept.content) ? kept.content : [],
      ...(kept.structuredContent ? { structuredContent: kept.structuredContent } : {}),
    });
  }

  return new Proxy(client, {
    get(target, property, receiver) {
      if (property === "callTool") return callTool;
      const value: unknown = Reflect.get(target, property, receiver);
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}
