// Approval waits against the live server: tests/client_ts decides from Python (the
// services layer, as a person in the console would) once the operation waits, by the
// tool's name: ts_approve_* approved, ts_reject_* rejected, ts_edit_* approved with the
// amount halved, ts_hook_* approved and then told to this process by a webhook the
// server's signing code signed.

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import {
  NotifiedWaiter,
  PollingWaiter,
  Runner,
  type ToolContract,
  verifyWebhook,
  webhookOperationId,
} from "../src/index.js";
import { liveClient, refundContract, refunds, toolName } from "./support.js";

const ARGS = { payment_id: "pay_9", amount_cents: 800 };

async function setup(prefix: string, approval: ToolContract["approval"] = { mode: "always" }) {
  const client = liveClient();
  const tool = toolName(prefix);
  await client.putTool(tool, refundContract("irreversible", { approval }));
  const run = await client.createRun({ principal: "user:alice" });
  return { client, tool, run: run.id };
}

test("waits for the approval by polling, then claims and calls once", async () => {
  const { client, tool, run } = await setup("ts_approve");
  const waiter = new PollingWaiter({ initialS: 0.05, maxS: 0.2 });
  const runner = new Runner(client, { waiter, waitS: 120, log: () => {} });
  const provider = refunds();
  const result = await runner.execute({ run, tool, operationKey: "a-1", arguments: ARGS, call: provider.call });
  assert.equal(result.status, "succeeded");
  assert.equal(provider.contexts.length, 1);
  assert.ok(waiter.polls >= 1);
  const kinds = (await client.events(result.operation.id)).map((event) => event.kind);
  assert.deepEqual(kinds.slice(0, 3), ["registered", "approval_requested", "decision"]);
});

test("approvalWaitS 0 answers awaiting_approval at once, with the next action for the model", async () => {
  const client = liveClient();
  const tool = toolName("ts_pending");
  await client.putTool(tool, refundContract("irreversible", { approval: { mode: "always" } }));
  const run = await client.createRun({ principal: "user:alice" });
  const provider = refunds();
  const result = await new Runner(client, { log: () => {} }).execute({
    run: run.id,
    tool,
    operationKey: "p-1",
    arguments: ARGS,
    call: provider.call,
    approvalWaitS: 0,
  });
  assert.equal(result.refusal, "approval_required");
  assert.equal(result.status, "awaiting_approval");
  assert.deepEqual(result.forModel()["allowed_next_actions"], ["wait_for_approval"]);
  assert.equal(provider.contexts.length, 0);
});

test("a rejection ends the call with the person's reason and no attempt", async () => {
  const { client, tool, run } = await setup("ts_reject");
  const runner = new Runner(client, { waiter: new PollingWaiter({ initialS: 0.05, maxS: 0.2 }), waitS: 120 });
  const provider = refunds();
  const result = await runner.execute({ run, tool, operationKey: "r-1", arguments: ARGS, call: provider.call });
  assert.equal(provider.contexts.length, 0);
  assert.equal(result.status, "rejected");
  assert.equal(result.envelope.code, "approval_rejected");
  assert.match(result.envelope.message, /duplicate refund/);
});

test("an approval with changes runs the successor with the approver's edits", async () => {
  const { client, tool, run } = await setup("ts_edit", { mode: "always", editable: ["/amount_cents"] });
  const runner = new Runner(client, { waiter: new PollingWaiter({ initialS: 0.05, maxS: 0.2 }), waitS: 120 });
  const provider = refunds();
  const result = await runner.execute({ run, tool, operationKey: "e-1", arguments: ARGS, call: provider.call });
  assert.equal(result.status, "succeeded");
  assert.equal(provider.contexts.length, 1);
  const ctx = provider.contexts[0]!;
  assert.deepEqual(ctx.arguments, { ...ARGS, amount_cents: ARGS.amount_cents / 2 });
  assert.equal(result.operation.operation_key, "e-1~edit-1");
  assert.equal(ctx.operationId, result.operation.id);
  assert.equal(ctx.idempotencyKey, result.operation.idempotency_key);
});

test("a webhook waiter: the signed approval.decided delivery wakes the runner", async () => {
  const secret = process.env["EFFECTGATE_WEBHOOK_SECRET"];
  const handoff = process.env["EFFECTGATE_HANDOFF"];
  assert.ok(secret && handoff, "EFFECTGATE_WEBHOOK_SECRET and EFFECTGATE_HANDOFF");
  // Without a notification this waiter would poll again only after an hour.
  const waiter = new NotifiedWaiter({ fallbackPollS: 3600 });
  const refusedDeliveries: string[] = [];
  const receiver = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      try {
        const event = verifyWebhook(secret, Buffer.concat(chunks), req.headers);
        const id = webhookOperationId(event);
        if (id !== null) waiter.notify(id);
        res.writeHead(204).end();
      } catch (error) {
        refusedDeliveries.push(String(error));
        res.writeHead(400).end();
      }
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  const { port } = receiver.address() as AddressInfo;
  const url = `http://127.0.0.1:${port}/hooks/effectgate`;
  try {
    const { client, tool, run } = await setup("ts_hook");
    // pytest decides only once the waiter has read the operation still waiting (the
    // handoff file appears then): the decision cannot land before that first read, so
    // the delivery is what wakes the waiter, whatever the machine's load.
    const getOperation = client.getOperation.bind(client);
    client.getOperation = async (id: string) => {
      const operation = await getOperation(id);
      if (operation.status === "awaiting_approval") writeFileSync(handoff, JSON.stringify({ url }));
      return operation;
    };
    const runner = new Runner(client, { waiter, waitS: 120 });
    const provider = refunds();
    const result = await runner.execute({ run, tool, operationKey: "h-1", arguments: ARGS, call: provider.call });
    assert.equal(result.status, "succeeded");
    assert.equal(provider.contexts.length, 1);
    // pytest sent a tampered delivery first: refused, and it woke nobody.
    assert.equal(refusedDeliveries.length, 1);
  } finally {
    receiver.closeAllConnections();
    receiver.close();
  }
});
