// What the tests share: the live server pytest started (tests/client_ts), a runner token
// of their own, the fake payment provider (bench/fake_provider.py) and a contract.

import { randomBytes } from "node:crypto";
import { type IncomingMessage, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";

import {
  EffectgateClient,
  Failed,
  type AttemptContext,
  type EffectgateClientOptions,
  type ToolContract,
  Succeeded,
  outcomeFromFetchError,
} from "../src/index.js";

function need(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these tests from tests/client_ts`);
  return value;
}

export const env = {
  get url(): string {
    return need("EFFECTGATE_URL");
  },
  get token(): string {
    return need("EFFECTGATE_TOKEN");
  },
  get provider(): string {
    return need("PROVIDER_URL");
  },
};

export function liveClient(opts: Partial<EffectgateClientOptions> = {}): EffectgateClient {
  return new EffectgateClient({ baseUrl: env.url, token: env.token, backoffBaseMs: 5, ...opts });
}

/** A tool name of this test's own (tool names are global on a server). */
export function toolName(prefix: string): string {
  return `${prefix}_${randomBytes(4).toString("hex")}`;
}

export function refundContract(
  effectClass: ToolContract["effect_class"],
  overrides: Partial<ToolContract> = {},
): ToolContract {
  return {
    effect_class: effectClass,
    input_schema: {
      type: "object",
      required: ["payment_id", "amount_cents"],
      properties: {
        payment_id: { type: "string" },
        amount_cents: { type: "integer", minimum: 1 },
      },
      additionalProperties: false,
    },
    retry: { max_attempts: 3, retryable_codes: ["rate_limited"], base_delay_ms: 0, max_delay_ms: 0 },
    approval: { mode: "never" },
    ...overrides,
  };
}

/** A refund at the fake provider, with the attempt's idempotency key; records calls. */
export function refunds(): {
  call: (ctx: AttemptContext) => Promise<Succeeded<{ id: string; status: string }>>;
  contexts: AttemptContext[];
} {
  const contexts: AttemptContext[] = [];
  return {
    contexts,
    async call(ctx) {
      contexts.push(ctx);
      const url = `${env.provider}/refunds`;
      let response: Response;
      try {
        response = await fetch(url, {
          method: "POST",
          headers: { "Content-Type": "application/json", "Idempotency-Key": ctx.idempotencyKey },
          body: JSON.stringify(ctx.arguments),
          signal: ctx.signal,
        });
      } catch (error) {
        throw outcomeFromFetchError(error, url);
      }
      if (response.status >= 400) throw new Failed(`http_${response.status}`, await response.text());
      const refund = (await response.json()) as { id: string; status: string };
      return new Succeeded({ result: refund, downstreamId: refund.id });
    },
  };
}

/** A local HTTP server answering from a script: each request takes the next answer. */
export async function scriptedServer(
  script: ((req: IncomingMessage, res: ServerResponse) => void)[],
): Promise<{ url: string; requests: { method: string; url: string }[]; close: () => Promise<void> }> {
  const requests: { method: string; url: string }[] = [];
  const server = createServer((req, res) => {
    requests.push({ method: req.method ?? "", url: req.url ?? "" });
    req.resume();
    req.on("end", () => {
      const answer = script.shift();
      if (answer === undefined) {
        res.writeHead(500).end("script exhausted");
        return;
      }
      answer(req, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export function json(status: number, body: unknown, headers: Record<string, string> = {}) {
  return (_req: IncomingMessage, res: ServerResponse): void => {
    const type = status >= 400 ? "application/problem+json" : "application/json";
    res.writeHead(status, { "Content-Type": type, ...headers }).end(JSON.stringify(body));
  };
}

/** A sleep that records what it was asked to wait and returns at once. */
export function recordingSleep(): { sleep: (ms: number) => Promise<void>; waits: number[] } {
  const waits: number[] = [];
  return {
    waits,
    sleep: async (ms: number) => {
      waits.push(ms);
    },
  };
}
