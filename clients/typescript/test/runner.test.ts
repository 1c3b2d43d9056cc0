// Runner.execute against the live server and the fake payment provider: what Effectgate
// stored after each call is read back through the API.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  BudgetExhausted,
  EffectgateClient,
  Failed,
  InvalidEdit,
  OutcomeNotRecorded,
  PollingWaiter,
  Runner,
  Succeeded,
  Unknown,
  EXCEPTION_DETAIL_CHARS,
  applyEdits,
  exceptionDetail,
  type AttemptContext,
} from "../src/index.js";
import { env, liveClient, refundContract, refunds, toolName } from "./support.js";

const ARGS = { payment_id: "pay_1", amount_cents: 500 };

async function setup(runnerOpts: ConstructorParameters<typeof Runner>[1] = {}, client = liveClient()) {
  const runner = new Runner(client, {
    leaseS: 5,
    waitS: 10,
    waiter: new PollingWaiter({ initialS: 0.05, maxS: 0.2 }),
    log: () => {},
    ...runnerOpts,
  });
  const run = await client.createRun({ principal: "user:alice" });
  return { client, runner, run: run.id };
}

async function eventKinds(client: EffectgateClient, operationId: string): Promise<string[]> {
  return (await client.events(operationId)).map((event) => event.kind);
}

test("register with the inline claim, call the provider once, post its answer", async () => {
  const { client, runner, run } = await setup();
  const tool = toolName("ts_refund");
  await client.putTool(tool, refundContract("irreversible"));
  const provider = refunds();
  const result = await runner.execute({
    run,
    tool,
    operationKey: "order-1:refund",
    arguments: ARGS,
    call: provider.call,
    callId: "call_1",
    turn: 1,
  });
  assert.equal(result.status, "succeeded");
  assert.deepEqual(result.attempts, [1]);
  assert.equal(provider.contexts.length, 1);
  const ctx = provider.contexts[0]!;
  assert.equal(ctx.idempotencyKey, result.operation.idempotency_key);
  assert.deepEqual(ctx.arguments, ARGS);
  const refund = (result.output as Succeeded<{ id: string }>).result!;
  assert.equal(result.operation.downstream_id, refund.id);
  assert.equal(result.operation.call_id, "call_1");
  // The model reads the envelope and, once succeeded, the provider's answer.
  const forModel = result.forModel();
  assert.equal(forModel["status"], "succeeded");
  assert.equal(forModel["logical_operation_id"], result.operation.id);
  assert.deepEqual(forModel["allowed_next_actions"], []);
  assert.deepEqual(forModel["result"], refund);
  // One round trip registered and claimed: no separate claim request was needed.
  const kinds = await eventKinds(client, result.operation.id);
  assert.equal(kinds[0], "registered");
  assert.equal(kinds.filter((kind) => kind === "claimed").length, 1);
  // The provider holds one refund under the key.
  const lookup = await fetch(`${env.provider}/refunds/lookup/${encodeURIComponent(ctx.idempotencyKey)}`);
  assert.equal(((await lookup.json()) as { result: string }).result, "committed");
});

test("the same operation key replays the operation: the tool is not called again", async () => {
  const { client, runner, run } = await setup();
  const tool = toolName("ts_replay");
  await client.putTool(tool, refundContract("irreversible"));
  const provider = refunds();
  const first = await runner.execute({ run, tool, operationKey: "k", arguments: ARGS, call: provider.call });
  // A restarted process, another Runner: the key names the same effect.
  const again = await new Runner(client, { log: () => {} }).execute({
    run,
    tool,
    operationKey: "k",
    arguments: ARGS,
    call: provider.call,
  });
  assert.equal(provider.contexts.length, 1);
  assert.equal(again.operation.id, first.operation.id);
  assert.equal(again.status, "succeeded");
  assert.deepEqual(again.attempts, []);
  assert.deepEqual(again.forModel()["result"], first.forModel()["result"]);
});

test("an unknown outcome of an irreversible tool is never retried", async () => {
  const { client, runner, run } = await setup();
  const tool = toolName("ts_unknown");
  await client.putTool(tool, refundContract("irreversible", { reconcile: { mode: "manual" } }));
  let calls = 0;
  const call = async (_ctx: AttemptContext): Promise<never> => {
    calls += 1;
    throw new Unknown("timeout_unknown", "the provider did not answer in time");
  };
  const result = await runner.execute({ run, tool, operationKey: "k-unknown", arguments: ARGS, call });
  assert.equal(calls, 1);
  assert.equal(result.status, "outcome_unknown");
  assert.deepEqual(result.attempts, [1]);
  assert.equal(result.operation.status, "outcome_unknown");
  // Asked again (the model retries the tool call): still no second attempt.
  const again = await runner.execute({ run, tool, operationKey: "k-unknown", arguments: ARGS, call });
  assert.equal(calls, 1);
  assert.deepEqual(again.attempts, []);
  assert.equal(again.status, "outcome_unknown");
});

test("anything else a tool throws is posted as unknown (runner_exception)", async () => {
  const { client, runner, run } = await setup();
  const tool = toolName("ts_throws");
  await client.putTool(tool, refundContract("irreversible", { reconcile: { mode: "manual" } }));
  const result = await runner.execute({
    run,
    tool,
    operationKey: "k-throws",
    arguments: ARGS,
    call: async () => {
      throw new TypeError("socket hang up");
    },
  });
  assert.equal(result.status, "outcome_unknown");
  assert.equal(result.operation.error_code, "runner_exception");
  assert.match(result.operation.error_detail ?? "", /TypeError: socket hang up/);
});

test("a tool's exception reaches Effectgate and the log without URL credentials or queries", async () => {
  const lines: string[] = [];
  const { client, runner, run } = await setup({ log: (line: string) => lines.push(line) });
  const tool = toolName("ts_throws_secret");
  await client.putTool(tool, refundContract("irreversible", { reconcile: { mode: "manual" } }));
  const secret = "https://user:sk_live_abc@host/x?token=secret";
  const result = await runner.execute({
    run,
    tool,
    operationKey: "k-throws-secret",
    arguments: ARGS,
    call: async () => {
      throw new Error(`provider said no at ${secret} ${"x".repeat(1000)}`);
    },
  });
  assert.equal(result.operation.error_code, "runner_exception");
  const detail = result.operation.error_detail ?? "";
  assert.match(detail, /^Error: provider said no at https:\/\/host\/x /);
  assert.ok(detail.length <= EXCEPTION_DETAIL_CHARS, `${detail.length} characters`);
  const events = JSON.stringify(await client.events(result.operation.id));
  for (const text of [detail, events, lines.join("\n")]) {
    for (const leak of ["sk_live_abc", "token=secret", "user:"]) {
      assert.ok(!text.includes(leak), `${leak} leaked: ${text.slice(0, 300)}`);
    }
  }
  assert.ok(lines.some((line) => line.includes("https://host/x")), lines.join("\n"));
  assert.equal(exceptionDetail(new TypeError("a http://u:p@h/?q=1#f b")), "TypeError: a http://h/ b");
});

test("a retryable failure is retried under the same idempotency key", async () => {
  const { client, runner, run } = await setup();
  const tool = toolName("ts_retry");
  await client.putTool(tool, refundContract("irreversible"));
  const provider = refunds();
  let first = true;
  const call = async (ctx: AttemptContext) => {
    if (first) {
      first = false;
      throw new Failed("rate_limited", "slow down");
    }
    return provider.call(ctx);
  };
  const result = await runner.execute({ run, tool, operationKey: "k-retry", arguments: ARGS, call });
  assert.equal(result.status, "succeeded");
  assert.deepEqual(result.attempts, [1, 2]);
  assert.equal(provider.contexts[0]!.idempotencyKey, result.operation.idempotency_key);
});

test("heartbeats extend the lease while a long call runs", async () => {
  const beats: string[] = [];
  const counting: typeof fetch = async (input, init) => {
    const response = await fetch(input, init);
    if (String(input).endsWith("/heartbeat")) beats.push(((await response.clone().json()) as { lease_until: string }).lease_until);
    return response;
  };
  const client = new EffectgateClient({ baseUrl: env.url, token: env.token, fetch: counting });
  const { runner, run } = await setup({ leaseS: 2, heartbeatEveryS: 0.3 }, client);
  const tool = toolName("ts_long");
  await client.putTool(tool, refundContract("irreversible"));
  const provider = refunds();
  const result = await runner.execute({
    run,
    tool,
    operationKey: "k-long",
    arguments: ARGS,
    call: async (ctx) => {
      // The call lasts until the lease has been extended past where it first ended.
      while (!(beats.length >= 2 && beats.at(-1)! > ctx.leaseUntil)) {
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      assert.equal(ctx.signal.aborted, false);
      return provider.call(ctx);
    },
  });
  assert.equal(result.status, "succeeded");
  const kinds = await eventKinds(client, result.operation.id);
  assert.ok(!kinds.includes("late_outcome"), kinds.join(","));
});

test("a run out of budget refuses the registration with BudgetExhausted", async () => {
  const client = liveClient();
  const runner = new Runner(client, { log: () => {} });
  const run = await client.createRun({ principal: "user:alice", budgets: { max_tool_calls: 1 } });
  const tool = toolName("ts_budget");
  await client.putTool(tool, refundContract("irreversible"));
  const provider = refunds();
  await runner.execute({ run: run.id, tool, operationKey: "b-1", arguments: ARGS, call: provider.call });
  await assert.rejects(
    runner.execute({ run: run.id, tool, operationKey: "b-2", arguments: ARGS, call: provider.call }),
    (e: unknown) => {
      assert.ok(e instanceof BudgetExhausted);
      assert.equal(e.forModel()["code"], "budget_exhausted");
      return true;
    },
  );
  assert.equal(provider.contexts.length, 1);
});

test("an open breaker refuses the claim: the call returns with retry_later, the tool uncalled", async () => {
  const { client, runner, run } = await setup({ waitS: 0.5 });
  const tool = toolName("ts_breaker");
  await client.putTool(
    tool,
    refundContract("irreversible", { breaker: { failure_codes: ["upstream_5xx"], threshold: 1, cooldown_s: 600 } }),
  );
  const failing = async (): Promise<never> => {
    throw new Failed("upstream_5xx", "the provider answered 502");
  };
  const broken = await runner.execute({ run, tool, operationKey: "br-1", arguments: ARGS, call: failing });
  assert.equal(broken.status, "failed_permanent");
  const provider = refunds();
  const refused = await runner.execute({ run, tool, operationKey: "br-2", arguments: ARGS, call: provider.call });
  assert.equal(provider.contexts.length, 0);
  assert.equal(refused.refusal, "retry_later");
  assert.equal(refused.operation.status, "ready");
  assert.deepEqual(refused.attempts, []);
});

test("an unknown outcome of a compensable tool runs the undo", async () => {
  const { client, runner, run } = await setup();
  const tool = toolName("ts_undo");
  await client.putTool(tool, refundContract("compensable"));
  const undone: AttemptContext[] = [];
  const result = await runner.execute({
    run,
    tool,
    operationKey: "k-undo",
    arguments: ARGS,
    call: async () => {
      throw new Unknown("connection_lost", "the connection broke after sending");
    },
    undo: async (ctx) => {
      undone.push(ctx);
      return { voided: true };
    },
  });
  assert.equal(undone.length, 1);
  assert.equal(undone[0]!.idempotencyKey, `${result.operation.idempotency_key}:undo`);
  assert.equal(result.status, "compensated");
});

test("an outcome that cannot be posted is OutcomeNotRecorded, with the outcome to post later", async () => {
  const failing: typeof fetch = async (input, init) => {
    if (String(input).endsWith("/outcome")) throw new TypeError("fetch failed", { cause: { code: "ECONNRESET" } });
    return fetch(input, init);
  };
  const client = new EffectgateClient({ baseUrl: env.url, token: env.token, fetch: failing, maxRetries: 1, backoffBaseMs: 1 });
  const { runner, run } = await setup({}, client);
  const tool = toolName("ts_lost");
  await client.putTool(tool, refundContract("irreversible"));
  const provider = refunds();
  const error = await runner
    .execute({ run, tool, operationKey: "k-lost", arguments: ARGS, call: provider.call })
    .then(() => assert.fail("the outcome was posted"), (e: unknown) => e);
  assert.ok(error instanceof OutcomeNotRecorded);
  assert.equal(error.attempt, 1);
  assert.equal(error.outcome["kind"], "succeeded");
  // Posted later, with a client that reaches Effectgate, it is recorded.
  const op = await liveClient().postOutcome(error.operationId, error.attempt, error.outcome);
  assert.equal(op.status, "succeeded");
  assert.equal(provider.contexts.length, 1);
});

test("a 502 that lasts on the outcome is OutcomeNotRecorded, with the outcome and the last request id", async () => {
  let outcomeTries = 0;
  const failing: typeof fetch = async (input, init) => {
    if (String(input).endsWith("/outcome")) {
      outcomeTries += 1;
      const problem = { type: "about:blank", title: "Bad Gateway", status: 502, code: "internal_error" };
      return new Response(JSON.stringify(problem), {
        status: 502,
        headers: { "Content-Type": "application/problem+json", "X-Request-Id": `req_bad_${outcomeTries}` },
      });
    }
    return fetch(input, init);
  };
  const client = new EffectgateClient({ baseUrl: env.url, token: env.token, fetch: failing, maxRetries: 2, backoffBaseMs: 1 });
  const { runner, run } = await setup({}, client);
  const tool = toolName("ts_502");
  await client.putTool(tool, refundContract("irreversible"));
  const provider = refunds();
  const error = await runner
    .execute({ run, tool, operationKey: "k-502", arguments: ARGS, call: provider.call })
    .then(() => assert.fail("the outcome was posted"), (e: unknown) => e);
  assert.ok(error instanceof OutcomeNotRecorded, String(error));
  assert.equal(outcomeTries, 3);
  assert.equal(error.requestId, "req_bad_3");
  assert.equal(error.outcome["kind"], "succeeded");
  const op = await liveClient().postOutcome(error.operationId, error.attempt, error.outcome);
  assert.equal(op.status, "succeeded");
  assert.equal(provider.contexts.length, 1);
});

test("a proxy's 504 page that lasts on the outcome is OutcomeNotRecorded too", async () => {
  const failing: typeof fetch = async (input, init) =>
    String(input).endsWith("/outcome") ? new Response("<html>gateway timeout</html>", { status: 504 }) : fetch(input, init);
  const client = new EffectgateClient({ baseUrl: env.url, token: env.token, fetch: failing, maxRetries: 1, backoffBaseMs: 1 });
  const { runner, run } = await setup({}, client);
  const tool = toolName("ts_504");
  await client.putTool(tool, refundContract("irreversible"));
  const error = await runner
    .execute({ run, tool, operationKey: "k-504", arguments: ARGS, call: refunds().call })
    .then(() => assert.fail("the outcome was posted"), (e: unknown) => e);
  assert.ok(error instanceof OutcomeNotRecorded, String(error));
  assert.equal(error.requestId, null);
});

test("the runner's log lines carry no control characters from the server's text", async () => {
  const lines: string[] = [];
  const beats: typeof fetch = async (input, init) => {
    if (String(input).endsWith("/heartbeat")) {
      const problem = { status: 400, code: "invalid_request", detail: "bad\u001b[2J\r\nFORGED line\u202e" };
      return new Response(JSON.stringify(problem), { status: 400, headers: { "Content-Type": "application/problem+json" } });
    }
    return fetch(input, init);
  };
  const client = new EffectgateClient({ baseUrl: env.url, token: env.token, fetch: beats });
  const { runner, run } = await setup({ leaseS: 2, heartbeatEveryS: 0.05, log: (line) => lines.push(line) }, client);
  const tool = toolName("ts_logged");
  await client.putTool(tool, refundContract("irreversible"));
  const provider = refunds();
  await runner.execute({
    run,
    tool,
    operationKey: "k-logged",
    arguments: ARGS,
    call: async (ctx) => {
      await new Promise((resolve) => setTimeout(resolve, 300));
      return provider.call(ctx);
    },
  });
  const logged = lines.filter((line) => line.includes("FORGED"));
  assert.ok(logged.length > 0, lines.join("|"));
  for (const line of logged) {
    assert.doesNotMatch(line, /[\u0000-\u001f\u007f-\u009f\u202a-\u202e]/);
    assert.match(line, /bad\[2JFORGED line/);
  }
});

describe("applyEdits", () => {
  const args = () => ({ payment_id: "pay_1", amount_cents: 500, items: [{ sku: "a" }, { sku: "b" }], meta: { note: "x" } });

  test("replaces values through own fields and array items, on a copy", () => {
    const original = args();
    const edited = applyEdits(original, [
      { path: "/amount_cents", to: 300 },
      { path: "/items/1/sku", to: "c" },
      { path: "/meta/note", to: { deep: true } },
      { path: "/meta/a~1b~0c", to: 1 },
    ]);
    assert.deepEqual(edited, {
      payment_id: "pay_1",
      amount_cents: 300,
      items: [{ sku: "a" }, { sku: "c" }],
      meta: { note: { deep: true }, "a/b~c": 1 },
    });
    assert.deepEqual(original, args());
  });

  for (const path of ["/__proto__/polluted", "/constructor/prototype/polluted", "/meta/__proto__", "/prototype"]) {
    test(`refuses ${path}, and Object.prototype stays clean`, () => {
      assert.throws(() => applyEdits(args(), [{ path, to: "yes" }]), InvalidEdit);
      assert.equal(({} as Record<string, unknown>)["polluted"], undefined);
      assert.equal(Object.hasOwn(Object.prototype, "polluted"), false);
    });
  }

  for (const path of ["", "amount_cents", "/missing/x", "/payment_id/x", "/items/2/sku", "/items/01/sku", "/items/-/sku", "/items/1e0/sku", "/items/2", "/items/-", "/items/toString/x", "/meta/toString/x"]) {
    test(`refuses ${JSON.stringify(path)} without creating anything`, () => {
      const original = args();
      assert.throws(() => applyEdits(original, [{ path, to: 1 }]), InvalidEdit);
      assert.deepEqual(original, args());
    });
  }

  test("one refused edit applies none (the caller's arguments are never changed)", () => {
    const original = args();
    assert.throws(
      () => applyEdits(original, [{ path: "/amount_cents", to: 1 }, { path: "/__proto__/polluted", to: 1 }]),
      InvalidEdit,
    );
    assert.deepEqual(original, args());
  });
});

test("an approval whose edit is refused rejects execute with InvalidEdit: the tool is not called", async () => {
  // A scripted Effectgate: the operation was superseded by an edited copy whose edit
  // climbs into Object.prototype.
  const requests: string[] = [];
  const operation = (id: string, extra: Record<string, unknown>) => ({
    id, run: "run_1", tool: "refund", status: "ready", attempts: 0, idempotency_key: `eg_${id}`, ...extra,
  });
  const scripted: typeof fetch = async (input, init) => {
    const url = new URL(String(input));
    requests.push(`${init?.method ?? "GET"} ${url.pathname}`);
    const body =
      url.pathname.endsWith("/operations") && init?.method === "POST"
        ? operation("op_1", { status: "superseded", superseded_by: "op_2" })
        : operation("op_2", { edits: [{ path: "/constructor/prototype/polluted", from: null, to: "yes" }] });
    return new Response(JSON.stringify(body), { status: url.pathname.endsWith("/operations") ? 201 : 200, headers: { "Content-Type": "application/json" } });
  };
  const client = new EffectgateClient({ baseUrl: "http://effectgate.invalid", token: "egr_x", fetch: scripted });
  const runner = new Runner(client, { log: () => {} });
  let called = 0;
  const error = await runner
    .execute({ run: "run_1", tool: "refund", operationKey: "k-edit", arguments: ARGS, call: async () => { called += 1; } })
    .then(() => assert.fail("execute resolved"), (e: unknown) => e);
  assert.ok(error instanceof InvalidEdit, String(error));
  assert.equal(error.path, "/constructor/prototype/polluted");
  assert.equal(called, 0);
  assert.deepEqual(requests, ["POST /api/v1/operations", "GET /api/v1/operations/op_2"]);
  assert.equal(({} as Record<string, unknown>)["polluted"], undefined);
});
