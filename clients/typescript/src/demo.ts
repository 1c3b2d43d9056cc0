// A stand-in payment provider for trying Effectgate out (docs/client-typescript.md, Quick
// start): the TypeScript twin of the Python client's effectgate_client.demo.
//
// `await DemoProvider.start()` serves on a free loopback port what the quick start's
// refund tool calls, from memory, until it is closed:
//
// - `POST /refunds` with `{"payment_id": string, "amount_cents": integer}` and an
//   `Idempotency-Key` header commits one refund per key and answers
//   `{"id": "re_0000001", "status": "succeeded", "payment_id": ..., "amount_cents": ...}`;
//   a repeat with the same key answers the same refund and commits nothing, as a provider
//   that honours idempotency keys does. A body it cannot read is 400, a missing key 428, a
//   key over 255 characters 400, a body over 16 KiB 413, a new key once it holds 10 000
//   refunds 429.
// - `GET /refunds/lookup/{key}` answers in the shape Effectgate's lookups read (api.md,
//   Lookup URLs): `committed` with the refund's id, or `not_found`.
//
// It is for demos and examples: no authentication, no persistence, loopback by default.
// Like the Python one's daemon thread, it does not keep the process alive by itself.

import { type IncomingMessage, type Server, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";

/** A refund request is a few dozen bytes; anything much larger is not one. */
export const MAX_BODY_BYTES = 16 * 1024;
const LOOKUP_PREFIX = "/refunds/lookup/";
/** The refunds one provider keeps (a demo's handful, not a flood's): a new key beyond it
 * is answered 429. */
export const MAX_REFUNDS = 10_000;
/** The longest idempotency key taken, in characters (Effectgate's are far shorter). */
export const MAX_KEY_LENGTH = 255;

export interface DemoRefund {
  id: string;
  status: "succeeded";
  payment_id: string;
  amount_cents: number;
}

export type DemoLookup =
  | { result: "committed"; downstream_id: string; evidence: DemoRefund }
  | { result: "not_found"; evidence: { provider: "demo" } };

export class DemoProvider {
  /** The refunds committed, by idempotency key. */
  readonly refunds = new Map<string, DemoRefund>();
  readonly host: string;
  readonly port: number;
  readonly #server: Server;
  #ids = 0;

  private constructor(server: Server) {
    const address = server.address() as AddressInfo;
    this.#server = server;
    this.host = address.address;
    this.port = address.port;
  }

  /** Serve on `host` (loopback by default) and `port` (a free one by default). */
  static async start(opts: { host?: string; port?: number } = {}): Promise<DemoProvider> {
    let provider: DemoProvider | undefined;
    const server = createServer((req, res) => {
      if (provider) handle(provider, req, res);
      else res.writeHead(503).end();
    });
    // A caller that stops sending does not hold a request open for long.
    server.requestTimeout = 30_000;
    server.headersTimeout = 10_000;
    server.on("connection", (socket) => socket.unref());
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(opts.port ?? 0, opts.host ?? "127.0.0.1", () => {
        server.off("error", reject);
        resolve();
      });
    });
    server.unref();
    provider = new DemoProvider(server);
    return provider;
  }

  get url(): string {
    const host = this.host.includes(":") ? `[${this.host}]` : this.host;
    return `http://${host}:${this.port}`;
  }

  /** The contract's `reconcile.url` for this provider. */
  get lookupTemplate(): string {
    return `${this.url}${LOOKUP_PREFIX}{idempotency_key}`;
  }

  /** Commit the refund of this key unless it is committed already; either way, answer it. */
  refund(opts: { key: string; paymentId: string; amountCents: number }): DemoRefund {
    let refund = this.refunds.get(opts.key);
    if (refund === undefined) {
      this.#ids += 1;
      refund = {
        id: `re_${String(this.#ids).padStart(7, "0")}`,
        status: "succeeded",
        payment_id: opts.paymentId,
        amount_cents: opts.amountCents,
      };
      this.refunds.set(opts.key, refund);
    }
    return refund;
  }

  lookup(key: string): DemoLookup {
    const refund = this.refunds.get(key);
    if (refund === undefined) return { result: "not_found", evidence: { provider: "demo" } };
    return { result: "committed", downstream_id: refund.id, evidence: refund };
  }

  /** Stop serving; resolves once every connection is closed. */
  close(): Promise<void> {
    return new Promise((resolve) => {
      this.#server.close(() => resolve());
      this.#server.closeAllConnections();
    });
  }
}

function answer(res: ServerResponse, status: number, body: unknown, close = false): void {
  const data = JSON.stringify(body);
  const headers: Record<string, string | number> = {
    "Content-Type": "application/json",
    "Content-Length": Buffer.byteLength(data),
  };
  if (close) headers["Connection"] = "close";
  res.writeHead(status, headers).end(data);
}

function handle(provider: DemoProvider, req: IncomingMessage, res: ServerResponse): void {
  const path = (req.url ?? "/").split("?", 1)[0]!;
  if (req.method === "GET" || req.method === "HEAD") {
    req.resume();
    if (!path.startsWith(LOOKUP_PREFIX)) {
      answer(res, 404, { error: "GET /refunds/lookup/{key} is the only endpoint" });
      return;
    }
    answer(res, 200, provider.lookup(unquote(path.slice(LOOKUP_PREFIX.length))));
    return;
  }
  if (req.method !== "POST") {
    req.resume();
    res.setHeader("Allow", "GET, POST");
    answer(res, 405, { error: "POST /refunds and GET /refunds/lookup/{key} are the endpoints" });
    return;
  }
  const tooLarge = () =>
    answer(res, 413, { error: `bodies are at most ${MAX_BODY_BYTES} bytes` }, true);
  const declared = Number(req.headers["content-length"] ?? 0);
  if (declared > MAX_BODY_BYTES) {
    tooLarge();
    return;
  }
  // A chunked body declares no length: count what arrives, and stop at the bound.
  const chunks: Buffer[] = [];
  let size = 0;
  let refused = false;
  req.on("data", (chunk: Buffer) => {
    if (refused) return;
    size += chunk.length;
    if (size > MAX_BODY_BYTES) {
      refused = true;
      chunks.length = 0;
      tooLarge();
      return;
    }
    chunks.push(chunk);
  });
  req.on("end", () => {
    if (refused) return;
    if (path !== "/refunds") {
      answer(res, 404, { error: "POST /refunds is the only endpoint" });
      return;
    }
    const request = refundRequest(Buffer.concat(chunks));
    if (request === null) {
      answer(res, 400, { error: 'send {"payment_id": str, "amount_cents": int >= 1}' });
      return;
    }
    const header = req.headers["idempotency-key"];
    const key = (Array.isArray(header) ? header[0] : header)?.trim() ?? "";
    if (!key) {
      answer(res, 428, { error: "send an Idempotency-Key header" });
      return;
    }
    if (key.length > MAX_KEY_LENGTH) {
      answer(res, 400, { error: `an Idempotency-Key is at most ${MAX_KEY_LENGTH} characters` });
      return;
    }
    if (!provider.refunds.has(key) && provider.refunds.size >= MAX_REFUNDS) {
      answer(res, 429, { error: `this demo provider keeps at most ${MAX_REFUNDS} refunds` });
      return;
    }
    answer(res, 200, provider.refund({ key, ...request }));
  });
  req.on("error", () => res.destroy());
}

function refundRequest(raw: Buffer): { paymentId: string; amountCents: number } | null {
  let body: unknown;
  try {
    body = JSON.parse(raw.toString("utf-8"));
  } catch {
    return null;
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) return null;
  const { payment_id: paymentId, amount_cents: amountCents } = body as Record<string, unknown>;
  if (typeof paymentId !== "string" || !paymentId) return null;
  if (typeof amountCents !== "number" || !Number.isSafeInteger(amountCents) || amountCents < 1) return null;
  return { paymentId, amountCents };
}

/** The key as sent; a malformed escape stays as it is (as Python's `unquote` leaves it). */
function unquote(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}
