// The AI SDK guard against a live Effectgate, with the SDK's own mock model
// (MockLanguageModelV4 from ai/test: scripted tool calls, no network, no model).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { generateText, isStepCount, jsonSchema, streamText, tool, type ModelMessage } from "ai";
import { MockLanguageModelV4, convertArrayToReadableStream } from "ai/test";

import { approvalResponses, currentAttempt, guard } from "../src/ai-sdk.js";
import { decide, liveRunner, refundContract, Refunds, toolName } from "./guard-support.js";

type RefundInput = { payment_id: string; amount_cents: number };

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** A mock model that asks for one refund (call id `call_1`), then answers in text; it
 * records every prompt it was given. */
function scriptedModel(name: string, input: RefundInput) {
  const prompts: unknown[] = [];
  const model = new MockLanguageModelV4({
    doGenerate: async (options) => {
      prompts.push(options.prompt);
      const asked = prompts.length === 1;
      return asked
        ? {
            content: [{ type: "tool-call", toolCallId: "call_1", toolName: name, input: JSON.stringify(input) }],
            finishReason: { unified: "tool-calls", raw: undefined },
            usage,
            warnings: [],
          }
        : {
            content: [{ type: "text", text: "Done." }],
            finishReason: { unified: "stop", raw: undefined },
            usage,
            warnings: [],
          };
    },
  });
  return { model, prompts };
}

/** The tool results the model was shown in its last prompt. */
function toolResults(prompts: unknown[]): { type: string; value?: unknown; reason?: string }[] {
  const last = prompts.at(-1) as { role: string; content: { type: string; output: any }[] }[];
  return last
    .filter((message) => message.role === "tool")
    .flatMap((message) => message.content.filter((part) => part.type === "tool-result").map((part) => part.output));
}

async function setUp(approval: Record<string, unknown> = { mode: "never" }, budgets?: { max_tool_calls: number }) {
  const runner = liveRunner();
  const name = toolName("ai_refund");
  const run = (await runner.client.createRun({ principal: "user:alice", ...(budgets ? { budgets } : {}) })).id;
  const refunds = new Refunds();
  const refund = tool({
    description: "Refund a payment.",
    inputSchema: jsonSchema<RefundInput>({
      type: "object",
      properties: { payment_id: { type: "string" }, amount_cents: { type: "integer" } },
      required: ["payment_id", "amount_cents"],
    }),
    execute: async ({ payment_id, amount_cents }) =>
      refunds.refund(payment_id, amount_cents, currentAttempt()?.idempotencyKey),
  });
  const guarded = guard(refund, { runner, run, name, contract: refundContract({ approval } as never) });
  return { runner, name, run, refunds, tools: { [name]: guarded } };
}

describe("AI SDK guard", () => {
  test("a call runs once through Effectgate, and a replay of it does not call again", async () => {
    const { name, refunds, tools } = await setUp();
    const input = { payment_id: "pay_1", amount_cents: 500 };
    const first = scriptedModel(name, input);
    const result = await generateText({ model: first.model, tools, prompt: "Refund pay_1", stopWhen: isStepCount(3) });
    assert.equal(result.text, "Done.");
    assert.equal(refunds.committed.length, 1);
    assert.match(refunds.committed[0]!.key ?? "", /.{16,}/); // the attempt's idempotency key
    const [seen] = toolResults(first.prompts);
    const envelope = seen!.value as Record<string, unknown>;
    assert.equal(envelope["status"], "succeeded");
    assert.equal(envelope["result"], "re_1");
    assert.ok(Array.isArray(envelope["allowed_next_actions"]));

    // The same conversation again (a retry after a crash): same run, same call id.
    const again = scriptedModel(name, input);
    await generateText({ model: again.model, tools, prompt: "Refund pay_1", stopWhen: isStepCount(3) });
    assert.equal(refunds.committed.length, 1, "the replay must not refund again");
    const [replayed] = toolResults(again.prompts);
    assert.equal((replayed!.value as Record<string, unknown>)["status"], "succeeded");
    assert.equal((replayed!.value as Record<string, unknown>)["result"], "re_1");
  });

  test("a pending approval is the SDK's approval request; once approved in Effectgate the call runs once", async () => {
    const { name, refunds, tools } = await setUp({ mode: "always" });
    const { model, prompts } = scriptedModel(name, { payment_id: "pay_2", amount_cents: 70000 });
    const messages: ModelMessage[] = [{ role: "user", content: "Refund pay_2" }];
    let result = await generateText({ model, tools, messages, stopWhen: isStepCount(3) });
    assert.ok(result.content.some((part) => part.type === "tool-approval-request"));
    assert.equal(refunds.committed.length, 0);
    messages.push(...result.response.messages);

    // Nobody decided yet: nothing to answer, one request pending with its page.
    let answers = await approvalResponses(messages, tools);
    assert.equal(answers.message, null);
    assert.equal(answers.pending.length, 1);
    const pending = answers.pending[0]!;
    assert.match(pending.approvalUrl ?? "", new RegExp(`/approvals/${pending.approval}/$`));

    await decide(pending.approval!, true, "ok, customer called");
    answers = await approvalResponses(messages, tools);
    assert.equal(answers.pending.length, 0);
    assert.ok(answers.message);
    messages.push(answers.message);
    result = await generateText({ model, tools, messages, stopWhen: isStepCount(3) });
    assert.equal(result.text, "Done.");
    assert.equal(refunds.committed.length, 1);
    const [seen] = toolResults(prompts);
    assert.equal((seen!.value as Record<string, unknown>)["status"], "succeeded");

    // Answered once: asking again answers nothing, and the call is not made again.
    answers = await approvalResponses(messages, tools);
    assert.equal(answers.message, null);
    assert.equal(refunds.committed.length, 1);
  });

  test("a rejection in Effectgate reaches the model with the reviewer's comment; nothing runs", async () => {
    const { name, refunds, tools } = await setUp({ mode: "always" });
    const { model, prompts } = scriptedModel(name, { payment_id: "pay_3", amount_cents: 90000 });
    const messages: ModelMessage[] = [{ role: "user", content: "Refund pay_3" }];
    const first = await generateText({ model, tools, messages, stopWhen: isStepCount(3) });
    messages.push(...first.response.messages);
    const { pending } = await approvalResponses(messages, tools);
    await decide(pending[0]!.approval!, false, "Refunded by phone already");
    const { message } = await approvalResponses(messages, tools);
    assert.ok(message);
    messages.push(message);
    const result = await generateText({ model, tools, messages, stopWhen: isStepCount(3) });
    assert.equal(result.text, "Done.");
    assert.equal(refunds.committed.length, 0);
    const [seen] = toolResults(prompts);
    assert.equal(seen!.type, "execution-denied");
    assert.match(seen!.reason ?? "", /Refunded by phone already/);
  });

  test("approved with changes: the call runs once, with the person's amount", async () => {
    const { name, refunds, tools } = await setUp({ mode: "always", editable: ["/amount_cents"] });
    const { model, prompts } = scriptedModel(name, { payment_id: "pay_4", amount_cents: 80000 });
    const messages: ModelMessage[] = [{ role: "user", content: "Refund pay_4" }];
    const first = await generateText({ model, tools, messages, stopWhen: isStepCount(3) });
    messages.push(...first.response.messages);
    const { pending } = await approvalResponses(messages, tools);
    await decide(pending[0]!.approval!, true, "half of it", { "/amount_cents": 40000 });
    const { message } = await approvalResponses(messages, tools);
    assert.ok(message);
    messages.push(message);
    await generateText({ model, tools, messages, stopWhen: isStepCount(3) });
    assert.deepEqual(
      refunds.committed.map(({ payment_id, amount_cents }) => [payment_id, amount_cents]),
      [["pay_4", 40000]],
    );
    const [seen] = toolResults(prompts);
    assert.equal((seen!.value as Record<string, unknown>)["status"], "succeeded");
  });

  test("a run out of budget reaches the model as a refusal; nothing runs", async () => {
    const { name, refunds, tools } = await setUp({ mode: "never" }, { max_tool_calls: 1 });
    const first = scriptedModel(name, { payment_id: "pay_5", amount_cents: 100 });
    await generateText({ model: first.model, tools, prompt: "Refund pay_5", stopWhen: isStepCount(3) });
    // A second call (a new call id) in the same run: over the run's budget.
    const second = new MockLanguageModelV4({
      doGenerate: [
        {
          content: [{ type: "tool-call", toolCallId: "call_2", toolName: name, input: JSON.stringify({ payment_id: "pay_6", amount_cents: 100 }) }],
          finishReason: { unified: "tool-calls", raw: undefined },
          usage,
          warnings: [],
        },
        { content: [{ type: "text", text: "Done." }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] },
      ],
    });
    const result = await generateText({ model: second, tools, prompt: "Refund pay_6", stopWhen: isStepCount(3) });
    assert.equal(refunds.committed.length, 1);
    const envelope = result.steps[0]!.toolResults[0]!.output as Record<string, unknown>;
    assert.equal(envelope["status"], "refused");
    assert.equal(envelope["code"], "budget_exhausted");
  });

  test("streamText: the same approval request, and the approved call runs once", async () => {
    const { name, refunds, tools } = await setUp({ mode: "always" });
    const finish = (unified: "tool-calls" | "stop") => ({ type: "finish" as const, finishReason: { unified, raw: undefined }, usage });
    // The stream parts of the two model calls (LanguageModelV4StreamPart).
    const streams: Record<string, unknown>[][] = [
      [
        { type: "stream-start" as const, warnings: [] },
        { type: "tool-call" as const, toolCallId: "call_1", toolName: name, input: JSON.stringify({ payment_id: "pay_11", amount_cents: 60000 }) },
        finish("tool-calls"),
      ],
      [
        { type: "stream-start" as const, warnings: [] },
        { type: "text-start" as const, id: "t" },
        { type: "text-delta" as const, id: "t", delta: "Done." },
        { type: "text-end" as const, id: "t" },
        finish("stop"),
      ],
    ];
    const model = new MockLanguageModelV4({ doStream: async () => ({ stream: convertArrayToReadableStream(streams.shift()! as never[]) }) });
    const messages: ModelMessage[] = [{ role: "user", content: "Refund pay_11" }];
    let stream = streamText({ model, tools, messages, stopWhen: isStepCount(3) });
    const parts = [];
    for await (const part of stream.fullStream) parts.push(part.type);
    assert.ok(parts.includes("tool-approval-request"));
    assert.equal(refunds.committed.length, 0);
    messages.push(...(await stream.response).messages);
    const { pending } = await approvalResponses(messages, tools);
    await decide(pending[0]!.approval!, true, "ok");
    const { message } = await approvalResponses(messages, tools);
    messages.push(message!);
    stream = streamText({ model, tools, messages, stopWhen: isStepCount(3) });
    assert.equal(await stream.text, "Done.");
    assert.equal(refunds.committed.length, 1);
  });
});
