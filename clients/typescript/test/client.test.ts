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
