// Runner.execute against the live server and the fake payment provider: what Effectgate
// stored after each call is read back through the API.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  BudgetExhausted,
  EffectgateClient,
  Failed,
  OutcomeNotRecorded,
  PollingWaiter,
  Runner,
  Succeeded,
  Unknown,
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
