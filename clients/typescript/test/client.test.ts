// EffectgateClient: the Python client's repeat rules against a scripted server, and the
// typed problem errors (with request ids) against the live one.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  EffectgateClient,
  IntentMismatch,
  InvalidArguments,
  InvalidPrincipal,
  NotAuthenticated,
  NotFound,
  ProblemError,
  RetryLater,
  ToolNotOwned,
  TransportError,
  UnexpectedResponse,
  UnknownTool,
} from "../src/index.js";
import { env, json, liveClient, recordingSleep, refundContract, scriptedServer, toolName } from "./support.js";

const problem = (status: number, code: string, extra: Record<string, unknown> = {}) => ({
  type: `https://effectgate.dev/problems/${code}`,
  title: code,
  status,
  detail: `${code} happened`,
  code,
  ...extra,
});

describe("repeats (a scripted server)", () => {
  test("a 503 is repeated after the Retry-After it names, then the answer is returned", async () => {
    const server = await scriptedServer([
      json(503, problem(503, "internal_error"), { "Retry-After": "2" }),
      json(502, { not: "a problem" }),
      json(200, { id: "run_1", status: "active" }),
    ]);
    const { sleep, waits } = recordingSleep();
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x", sleep });
    try {
      const run = await client.getRun("run_1");
      assert.equal(run.id, "run_1");
      assert.equal(server.requests.length, 3);
      assert.deepEqual(server.requests.map((r) => r.url), Array(3).fill("/api/v1/runs/run_1"));
      // Retry-After: 2 s, then a jittered backoff within the second try's ceiling
      // (50 ms doubled).
      assert.equal(waits[0], 2000);
      assert.ok(waits[1]! >= 0 && waits[1]! <= 100, `backoff ${waits[1]}`);
      assert.equal(client.stats.get("status:503"), 1);
      assert.equal(client.stats.get("status:502"), 1);
    } finally {
      await server.close();
    }
  });

  test("a 429's retry_after_ms paces the repeat", async () => {
    const server = await scriptedServer([
      json(429, problem(429, "rate_limited", { retry_after_ms: 1500 }), { "Retry-After": "2" }),
      json(200, { id: "op_1" }),
    ]);
    const { sleep, waits } = recordingSleep();
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x", sleep });
    try {
      await client.getOperation("op_1");
      assert.deepEqual(waits, [1500]);
    } finally {
      await server.close();
    }
  });

  test("refusals are answers: a 409 is thrown at once, typed, never repeated", async () => {
    const server = await scriptedServer([
      json(409, problem(409, "retry_later", { retry_after_ms: 250, request_id: "req_body" }), {
        "X-Request-Id": "req_header",
      }),
    ]);
    const { sleep, waits } = recordingSleep();
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x", sleep });
    try {
      const error = await client.claim("op_1").then(
        () => assert.fail("claimed"),
        (e: unknown) => e,
      );
      assert.ok(error instanceof RetryLater);
      assert.ok(error instanceof ProblemError);
      assert.equal(error.code, "retry_later");
      assert.equal(error.status, 409);
      assert.equal(error.retryAfterMs, 250);
      assert.equal(error.requestId, "req_body"); // the body's, when it has one
      assert.equal(error.repeated, false);
      assert.equal(server.requests.length, 1);
      assert.deepEqual(waits, []);
    } finally {
      await server.close();
    }
  });

  test("a problem without request_id takes the X-Request-Id header; a proxy page, even a 200, is UnexpectedResponse", async () => {
    const server = await scriptedServer([
      json(404, problem(404, "not_found"), { "X-Request-Id": "req_0123" }),
      (_req, res) => res.writeHead(400, { "Content-Type": "text/html" }).end("<h1>Bad</h1>"),
      (_req, res) => res.writeHead(200, { "Content-Type": "text/html" }).end("<h1>Sign in</h1>"),
    ]);
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x" });
    try {
      await assert.rejects(client.getRun("run_x"), (e: unknown) => {
        assert.ok(e instanceof NotFound);
        assert.equal(e.requestId, "req_0123");
        return true;
      });
      await assert.rejects(client.getRun("run_y"), (e: unknown) => {
        assert.ok(e instanceof UnexpectedResponse);
        assert.equal(e.status, 400);
        return true;
      });
      await assert.rejects(client.getRun("run_z"), (e: unknown) => {
        assert.ok(e instanceof UnexpectedResponse);
        assert.equal(e.status, 200);
        return true;
      });
    } finally {
      await server.close();
    }
  });

  test("a repeat answered with a refusal says so (the first try may have gone through)", async () => {
    const server = await scriptedServer([
      json(500, problem(500, "internal_error")),
      json(409, problem(409, "not_unknown")),
      json(200, { id: "op_1", status: "succeeded" }),
    ]);
    const { sleep } = recordingSleep();
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x", sleep });
    try {
      // reconcile: a not_unknown after a lost answer means the first try went through.
      const op = await client.reconcile("op_1", { result: "committed" });
      assert.equal(op.status, "succeeded");
      assert.deepEqual(
        server.requests.map((r) => `${r.method} ${r.url}`),
        [
          "POST /api/v1/operations/op_1/reconciliations",
          "POST /api/v1/operations/op_1/reconciliations",
          "GET /api/v1/operations/op_1",
        ],
      );
    } finally {
      await server.close();
    }
  });

  test("an unreachable server is a TransportError after maxRetries + 1 tries", async () => {
    const server = await scriptedServer([]);
    const url = server.url;
    await server.close(); // nothing listens there any more
    const { sleep, waits } = recordingSleep();
    const client = new EffectgateClient({ baseUrl: url, token: "egr_x", sleep, maxRetries: 2 });
    await assert.rejects(client.getOperation("op_1"), (e: unknown) => {
      assert.ok(e instanceof TransportError);
      assert.equal(e.method, "GET");
      assert.equal(e.path, "/operations/op_1");
      assert.match(e.message, /no answer after 3 tries/);
      return true;
    });
    assert.equal(waits.length, 2);
    assert.equal(client.stats.get("lost:ECONNREFUSED"), 2);
  });

  test("a 503 that lasts is thrown as the problem once the repeats are spent", async () => {
    const server = await scriptedServer(Array(3).fill(json(503, problem(503, "internal_error"))));
    const { sleep } = recordingSleep();
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x", sleep, maxRetries: 2 });
    try {
      await assert.rejects(client.getRun("run_1"), (e: unknown) => {
        assert.ok(e instanceof ProblemError);
        assert.equal(e.status, 503);
        assert.equal(e.repeated, true);
        return true;
      });
      assert.equal(server.requests.length, 3);
    } finally {
      await server.close();
    }
  });
});

describe("bounds on what an answer can make the client do", () => {
  const MiB = 1024 * 1024;

  test("a 20 MiB body over maxResponseBytes is not read on: UnexpectedResponse, not repeated", async () => {
    let written = 0;
    let closed = false;
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    const server = await scriptedServer([
      (_req, res) => {
        // Chunked: no Content-Length to refuse it by; the reader must stop on its own.
        res.writeHead(200, { "Content-Type": "application/json" });
        res.on("close", () => (closed = true));
        const pump = (): void => {
          while (written < 20 * MiB) {
            written += chunk.length;
            if (!res.write(chunk)) {
              res.once("drain", pump);
              return;
            }
          }
          res.end();
        };
        pump();
      },
    ]);
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x", maxResponseBytes: 256 * 1024 });
    try {
      await assert.rejects(client.getRun("run_1"), (e: unknown) => {
        assert.ok(e instanceof UnexpectedResponse, String(e));
        assert.equal(e.status, 200);
        assert.match(e.message, /maxResponseBytes/);
        assert.ok(e.text.length < 1000);
        return true;
      });
      assert.equal(server.requests.length, 1);
      // The reader was cancelled: the server never got to write the whole 20 MiB.
      for (let i = 0; i < 200 && !closed; i++) await new Promise((resolve) => setTimeout(resolve, 10));
      assert.ok(closed, "the connection was closed");
      assert.ok(written < 20 * MiB, `written ${written}`);
    } finally {
      await server.close();
    }
  });

  test("a Content-Length over maxResponseBytes is refused before reading", async () => {
    const server = await scriptedServer([
      (_req, res) => {
        res.writeHead(502, { "Content-Type": "text/html", "Content-Length": String(20 * MiB) });
        res.write("<html>");
      },
    ]);
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x", maxResponseBytes: MiB });
    try {
      await assert.rejects(client.getRun("run_1"), (e: unknown) => {
        assert.ok(e instanceof UnexpectedResponse, String(e));
        assert.equal(e.status, 502);
        assert.match(e.message, /Content-Length 20971520/);
        return true;
      });
      assert.equal(server.requests.length, 1);
    } finally {
      await server.close();
    }
  });

  test("a body within the default bound is read whole", async () => {
    const big = "x".repeat(2 * MiB);
    const server = await scriptedServer([json(200, { id: "run_1", status: "active", note: big })]);
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x" });
    try {
      const run = (await client.getRun("run_1")) as unknown as { note: string };
      assert.equal(run.note.length, big.length);
    } finally {
      await server.close();
    }
  });

  test("Retry-After and retry_after_ms are obeyed up to maxRetryWaitMs (60 s by default)", async () => {
    const server = await scriptedServer([
      json(503, problem(503, "internal_error"), { "Retry-After": "99999999999" }),
      json(429, problem(429, "rate_limited", { retry_after_ms: 2 ** 40 })),
      (_req, res) => res.writeHead(503, { "Retry-After": "3000000", "Content-Type": "text/html" }).end("<p>busy</p>"),
      json(503, problem(503, "internal_error", { retry_after_ms: 1500 })),
      json(200, { id: "run_1", status: "active" }),
    ]);
    const { sleep, waits } = recordingSleep();
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x", sleep });
    try {
      await client.getRun("run_1");
      assert.deepEqual(waits, [60_000, 60_000, 60_000, 1500]);
      assert.ok(waits.every((ms) => ms <= 2 ** 31 - 1));
    } finally {
      await server.close();
    }
    const capped = await scriptedServer([
      json(429, problem(429, "rate_limited", { retry_after_ms: 9000 })),
      json(200, { id: "run_1", status: "active" }),
    ]);
    const other = recordingSleep();
    const client2 = new EffectgateClient({ baseUrl: capped.url, token: "egr_x", sleep: other.sleep, maxRetryWaitMs: 250 });
    try {
      await client2.getRun("run_1");
      assert.deepEqual(other.waits, [250]);
    } finally {
      await capped.close();
    }
  });

  test("a request id not of the server's pattern is dropped; text is logged without controls", async () => {
    const server = await scriptedServer([
      json(404, problem(404, "not_found", { request_id: "req\r\nforged: yes" }), { "X-Request-Id": "req_ok-1.2:3" }),
      json(404, problem(404, "not_found", { detail: "gone\u001b[31m\r\nFAKE\u0085" }), { "X-Request-Id": "x".repeat(129) }),
      (_req, res) => res.writeHead(400, { "Content-Type": "text/html", "X-Request-Id": "-lead" }).end("a\u0007b"),
    ]);
    const client = new EffectgateClient({ baseUrl: server.url, token: "egr_x" });
    try {
      await assert.rejects(client.getRun("run_1"), (e: unknown) => {
        assert.ok(e instanceof NotFound);
        assert.equal(e.requestId, "req_ok-1.2:3");
        return true;
      });
      await assert.rejects(client.getRun("run_2"), (e: unknown) => {
        assert.ok(e instanceof NotFound);
        assert.equal(e.requestId, null);
        assert.equal(e.message, "404 not_found: gone[31mFAKE");
        return true;
      });
      await assert.rejects(client.getRun("run_3"), (e: unknown) => {
        assert.ok(e instanceof UnexpectedResponse);
        assert.equal(e.requestId, null);
        assert.equal(e.message, "HTTP 400: ab");
        return true;
      });
    } finally {
      await server.close();
    }
  });
});

describe("typed problems (the live server)", () => {
  // The X-Request-Id header of each answer, to compare with the errors' requestId.
  const seen: (string | null)[] = [];
  const recording: typeof fetch = async (input, init) => {
    const response = await fetch(input, init);
    seen.push(response.headers.get("x-request-id"));
    return response;
  };

  test("a bad token is NotAuthenticated, with the answer's request id", async () => {
    const client = new EffectgateClient({ baseUrl: env.url, token: "egr_wrong", fetch: recording });
    await assert.rejects(client.createRun({ principal: "user:alice" }), (e: unknown) => {
      assert.ok(e instanceof NotAuthenticated);
      assert.equal(e.status, 401);
      // The server's id for the request, in the body and the header alike.
      assert.match(e.requestId ?? "", /^req_[a-z0-9]{26}$/);
      assert.equal(e.requestId, e.problem.request_id);
      assert.equal(e.requestId, seen.at(-1));
      return true;
    });
  });

  test("registration refusals: UnknownTool, InvalidArguments, IntentMismatch, InvalidPrincipal", async () => {
    const client = liveClient();
    // A zero-width space hides in the name: not a usable identity.
    await assert.rejects(client.createRun({ principal: "user:al\u200bice" }), InvalidPrincipal);
    const run = await client.createRun({ principal: "user:alice" });
    const tool = toolName("ts_typed");
    await client.putTool(tool, refundContract("idempotent"));
    const base = { run: run.id, tool, operation_key: "typed-1" };
    await assert.rejects(
      client.register({ ...base, tool: toolName("ts_missing"), arguments: { payment_id: "p", amount_cents: 1 } }),
      UnknownTool,
    );
    await assert.rejects(client.register({ ...base, arguments: { payment_id: "p", amount_cents: -1 } }), (e: unknown) => {
      assert.ok(e instanceof InvalidArguments);
      assert.equal(e.errors[0]?.path, "/arguments/amount_cents");
      const envelope = e.forModel();
      assert.equal(envelope["status"], "refused");
      assert.equal(envelope["code"], "invalid_arguments");
      return true;
    });
    await client.register({ ...base, arguments: { payment_id: "p", amount_cents: 1 } });
    await assert.rejects(
      client.register({ ...base, arguments: { payment_id: "p", amount_cents: 2 } }),
      IntentMismatch,
    );
  });

  test("another runner's tool is ToolNotOwned", async () => {
    const owned = process.env["EFFECTGATE_OTHER_TOOL"];
    assert.ok(owned, "EFFECTGATE_OTHER_TOOL: a tool another runner owns");
    await assert.rejects(liveClient().putTool(owned, refundContract("idempotent")), (e: unknown) => {
      assert.ok(e instanceof ToolNotOwned);
      assert.equal(e.status, 403);
      return true;
    });
  });
});
