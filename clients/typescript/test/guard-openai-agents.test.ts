// The OpenAI Agents SDK guard against a live Effectgate, with the SDK's own scripted
// model (ScriptedModel from @openai/agents/testing: no network, no model).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Agent, ModelBehaviorError, RunContext, RunState, run, setTracingDisabled, tool } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall } from "@openai/agents/testing";
import { z } from "zod";

import { approvalRequest, currentAttempt, guard, isInvalidToolInput } from "../src/openai-agents.js";
import { decide, liveRunner, refundContract, Refunds, toolName } from "./guard-support.js";

setTracingDisabled(true);

function script(name: string, args: Record<string, unknown>, callId = "call_1"): ScriptedModel {
  return new ScriptedModel([[functionCall(name, args, { callId })], [assistantMessage("Done.")]]);
}

/** What the model read as the tool's output in its last request. */
function toolOutput(model: ScriptedModel): Record<string, unknown> {
  const input = model.lastCall!.request.input as { type: string; output?: { text?: string } | string }[];
  const result = input.filter((item) => item.type === "function_call_result").at(-1)!;
  const text = typeof result.output === "string" ? result.output : result.output!.text!;
  return JSON.parse(text) as Record<string, unknown>;
}

async function setUp(approval: Record<string, unknown> = { mode: "never" }) {
  const runner = liveRunner();
  const name = toolName("agents_refund");
  const effectgateRun = (await runner.client.createRun({ principal: "user:alice" })).id;
  const refunds = new Refunds();
  const refund = tool({
    name,
    description: "Refund a payment.",
    parameters: z.object({ payment_id: z.string(), amount_cents: z.number().int() }),
    errorFunction: null, // errors reach Effectgate
    execute: async ({ payment_id, amount_cents }) =>
      refunds.refund(payment_id, amount_cents, currentAttempt()?.idempotencyKey),
  });
  const guarded = guard(refund, { runner, run: effectgateRun, contract: refundContract({ approval } as never) });
  return { name, refunds, guarded };
}

describe("OpenAI Agents SDK guard", () => {
  test("a call runs once through Effectgate, and a run that repeats it does not call again", async () => {
    const { name, refunds, guarded } = await setUp();
    const args = { payment_id: "pay_1", amount_cents: 500 };
    const model = script(name, args);
    const result = await run(new Agent({ name: "support", tools: [guarded], model }), "Refund pay_1");
    assert.equal(result.finalOutput, "Done.");
    assert.equal(refunds.committed.length, 1);
    assert.match(refunds.committed[0]!.key ?? "", /.{16,}/);
    const envelope = toolOutput(model);
    assert.equal(envelope["status"], "succeeded");
    assert.equal(envelope["result"], "re_1");

    const again = script(name, args);
    await run(new Agent({ name: "support", tools: [guarded], model: again }), "Refund pay_1");
    assert.equal(refunds.committed.length, 1, "the repeated call must not refund again");
    assert.equal(toolOutput(again)["result"], "re_1");
  });

  test("a pending approval interrupts the run; resumed after the decision, the call runs exactly once", async () => {
    const { name, refunds, guarded } = await setUp({ mode: "always" });
    const model = script(name, { payment_id: "pay_2", amount_cents: 70000 });
    const agent = new Agent({ name: "support", tools: [guarded], model });
    let result = await run(agent, "Refund pay_2");
    assert.equal(result.interruptions.length, 1);
    assert.equal(refunds.committed.length, 0);
    const request = approvalRequest(result.interruptions[0]!);
    assert.ok(request?.approval);
    assert.match(request.approvalUrl ?? "", new RegExp(`/approvals/${request.approval}/$`));
    const saved = result.state.toString(); // e.g. kept in a database across a restart

    // Resumed before anyone decided: it interrupts again and nothing runs.
    result = await run(agent, await RunState.fromString(agent, saved));
    assert.equal(result.interruptions.length, 1);
    assert.equal(refunds.committed.length, 0);

    await decide(request.approval, true, "ok");
    result = await run(agent, await RunState.fromString(agent, saved));
    assert.equal(result.interruptions.length, 0);
    assert.equal(result.finalOutput, "Done.");
    assert.equal(refunds.committed.length, 1);
    assert.equal(toolOutput(model)["status"], "succeeded");

    // The same saved state resumed again (a second worker, a retry): no second refund.
    const replay = script(name, { payment_id: "pay_2", amount_cents: 70000 });
    const second = new Agent({ name: "support", tools: [guarded], model: replay });
    const state = await RunState.fromString(second, saved);
    await run(second, state);
    assert.equal(refunds.committed.length, 1);
  });

  test("a rejection in Effectgate reaches the model with the reviewer's comment; nothing runs", async () => {
    const { name, refunds, guarded } = await setUp({ mode: "always" });
    const model = script(name, { payment_id: "pay_3", amount_cents: 90000 });
    const agent = new Agent({ name: "support", tools: [guarded], model });
    let result = await run(agent, "Refund pay_3");
    const request = approvalRequest(result.interruptions[0]!);
    await decide(request!.approval!, false, "Refunded by phone already");
    result = await run(agent, result.state);
    assert.equal(result.finalOutput, "Done.");
    assert.equal(refunds.committed.length, 0);
    const envelope = toolOutput(model);
    assert.equal(envelope["status"], "rejected");
    assert.equal(envelope["code"], "approval_rejected");
    assert.match(String(envelope["message"]), /Refunded by phone already/);
  });

  test("a tool error is an unknown outcome, never retried; even one the SDK turned into text", async () => {
    const runner = liveRunner();
    const effectgateRun = (await runner.client.createRun({ principal: "user:alice" })).id;
    const contract = refundContract();
    let calls = 0;
    const failing = (name: string, errorFunction: null | undefined) =>
      guard(
        tool({
          name,
          description: "Refund, then lose the answer.",
          parameters: z.object({ payment_id: z.string(), amount_cents: z.number().int() }),
          ...(errorFunction === null ? { errorFunction: null } : {}),
          execute: async () => {
            calls += 1;
            throw new Error("the provider's answer was lost");
          },
        }),
        { runner, run: effectgateRun, contract },
      );
    for (const errorFunction of [null, undefined]) {
      const name = toolName("agents_lost");
      const guarded = failing(name, errorFunction);
      for (let i = 0; i < 2; i++) {
        const model = script(name, { payment_id: "pay_7", amount_cents: 100 });
        await run(new Agent({ name: "support", tools: [guarded], model }), "Refund pay_7");
        assert.equal(toolOutput(model)["status"], "outcome_unknown");
      }
    }
    assert.equal(calls, 2, "each tool ran once: an unknown outcome is not retried");
  });

  test("a run out of budget reaches the model as a refusal; an SDK timeout is refused", async () => {
    const runner = liveRunner();
    const effectgateRun = (await runner.client.createRun({ principal: "user:alice", budgets: { max_tool_calls: 1 } })).id;
    const refunds = new Refunds();
    const name = toolName("agents_budget");
    const options = {
      name,
      description: "Refund a payment.",
      parameters: z.object({ payment_id: z.string(), amount_cents: z.number().int() }),
      errorFunction: null,
      execute: async ({ payment_id, amount_cents }: { payment_id: string; amount_cents: number }) =>
        refunds.refund(payment_id, amount_cents, undefined),
    };
    const guarded = guard(tool(options), { runner, run: effectgateRun, contract: refundContract() });
    await run(new Agent({ name: "support", tools: [guarded], model: script(name, { payment_id: "pay_8", amount_cents: 100 }) }), "Refund pay_8");
    assert.equal(refunds.committed.length, 1);
    // A second call (a new call id) in the same run: over the run's budget.
    const model = script(name, { payment_id: "pay_9", amount_cents: 100 }, "call_2");
    await run(new Agent({ name: "support", tools: [guarded], model }), "Refund pay_9");
    assert.equal(refunds.committed.length, 1);
    assert.equal(toolOutput(model)["status"], "refused");
    assert.equal(toolOutput(model)["code"], "budget_exhausted");
    assert.throws(() => guard(tool({ ...options, timeoutMs: 1000 }), { runner, run: effectgateRun }), /timeoutMs/);
  });

  test("arguments the tool's own parameters refuse end the call as failed; the tool never runs", async () => {
    const runner = liveRunner();
    const effectgateRun = (await runner.client.createRun({ principal: "user:alice" })).id;
    const refunds = new Refunds();
    const name = toolName("agents_strict");
    const guarded = guard(
      tool({
        name,
        description: "Refund at least 10 cents.",
        parameters: z.object({ payment_id: z.string(), amount_cents: z.number().int().min(10) }),
        errorFunction: null,
        execute: async ({ payment_id, amount_cents }) => refunds.refund(payment_id, amount_cents, undefined),
      }),
      { runner, run: effectgateRun, contract: refundContract() },
    );
    const model = script(name, { payment_id: "pay_10", amount_cents: 5 });
    await run(new Agent({ name: "support", tools: [guarded], model }), "Refund pay_10");
    assert.equal(refunds.committed.length, 0);
    const envelope = toolOutput(model);
    assert.equal(envelope["status"], "failed_permanent");
    assert.equal(envelope["code"], "invalid_tool_input");
  });
});

describe("what counts as the SDK refusing a tool's input", () => {
  test("the SDK's own InvalidToolInputError does; a lookalike of the same name, or another ModelBehaviorError, does not", async () => {
    const strict = tool({
      name: "strict",
      description: "x",
      parameters: z.object({ amount_cents: z.number() }),
      errorFunction: null,
      execute: async () => "ran",
    });
    const thrown = await strict
      .invoke(new RunContext(), JSON.stringify({ amount_cents: "no" }))
      .then(() => assert.fail("the SDK accepted the input"), (e: unknown) => e);
    assert.ok(isInvalidToolInput(thrown), String(thrown));
    // A tool's own error that merely carries the name: the tool ran, its effect may be
    // out; it must never be taken for "never ran".
    class InvalidToolInputError extends Error {}
    assert.equal(isInvalidToolInput(new InvalidToolInputError("mine")), false);
    assert.equal(isInvalidToolInput(new ModelBehaviorError("model")), false);
    assert.equal(isInvalidToolInput({ constructor: { name: "InvalidToolInputError" } }), false);
  });
});
