// The MCP client guard against a live Effectgate: a real MCP server built with the SDK's
// McpServer, reached over the SDK's InMemoryTransport (no network), whose refund tool
// counts the effects it commits.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

import { ENVELOPE_META, IDEMPOTENCY_KEY_META, guardClient } from "../src/mcp.js";
import { decide, liveRunner, refundContract, Refunds, toolName } from "./guard-support.js";

/** A payments server with `name` (refunds) and `${name}_flaky` (commits, then answers an
 * error without saying which: the effect may exist). */
async function connected(approval: Record<string, unknown> = { mode: "never" }) {
  const runner = liveRunner();
  const name = toolName("mcp_refund");
  const refunds = new Refunds();
  const server = new McpServer({ name: "payments", version: "1.0.0" });
  const shape = { payment_id: z.string(), amount_cents: z.number().int() };
  server.registerTool(name, { description: "Refund a payment.", inputSchema: shape }, async (args, extra) => {
    const key = extra._meta?.[IDEMPOTENCY_KEY_META] as string | undefined;
    const id = refunds.refund(args.payment_id, args.amount_cents, key);
    return { content: [{ type: "text", text: `refunded ${args.amount_cents} cents as ${id}` }] };
  });
  server.registerTool(`${name}_flaky`, { description: "Refund, then fail.", inputSchema: shape }, async (args) => {
    refunds.refund(args.payment_id, args.amount_cents, undefined);
    throw new Error("the provider's answer was lost");
  });
  server.registerTool(`${name}_declined`, { description: "A declined refund.", inputSchema: shape }, async () => ({
    isError: true,
    content: [{ type: "text", text: "card declined" }],
    _meta: { "effectgate/error_code": "card_declined" },
  }));
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(serverSide);
  const client = new Client({ name: "agent", version: "1.0.0" });
  await client.connect(clientSide);
  const run = (await runner.client.createRun({ principal: "user:alice" })).id;
  const contract = refundContract({ approval } as never);
  const guarded = guardClient(client, {
    runner,
    run,
    contracts: {
      [name]: contract,
      [`${name}_flaky`]: contract,
      [`${name}_declined`]: refundContract({ retry: { max_attempts: 1 } } as never),
    },
  });
  return { name, refunds, guarded, close: () => client.close() };
}

function envelopeOf(result: CallToolResult): Record<string, unknown> {
  return (result._meta as Record<string, Record<string, unknown>>)[ENVELOPE_META]!;
}

describe("MCP client guard", () => {
  test("the same call twice is one operation and one refund; the server gets the idempotency key", async () => {
    const { name, refunds, guarded, close } = await connected();
    const args = { payment_id: "pay_1", amount_cents: 700 };
    const first = (await guarded.callTool({ name, arguments: args })) as CallToolResult;
    const second = (await guarded.callTool({ name, arguments: { amount_cents: 700, payment_id: "pay_1" } })) as CallToolResult;
    assert.equal(refunds.committed.length, 1);
    assert.match(refunds.committed[0]!.key ?? "", /.{16,}/);
    for (const result of [first, second]) {
      assert.equal(result.isError, false);
      assert.deepEqual(result.content[0], { type: "text", text: "refunded 700 cents as re_1" });
      assert.equal(envelopeOf(result)["status"], "succeeded");
      assert.equal(JSON.parse((result.content.at(-1) as { text: string }).text)["status"], "succeeded");
    }
    await close();
  });

  test("an error after the commit is unknown, never retried: calling again does not refund again", async () => {
    const { name, refunds, guarded, close } = await connected();
    const call = { name: `${name}_flaky`, arguments: { payment_id: "pay_2", amount_cents: 800 } };
    const first = (await guarded.callTool(call)) as CallToolResult;
    assert.equal(first.isError, true);
    assert.equal(envelopeOf(first)["status"], "outcome_unknown");
    const second = (await guarded.callTool(call)) as CallToolResult;
    assert.equal(envelopeOf(second)["status"], "outcome_unknown");
    assert.equal(refunds.committed.length, 1);
    // An error with its code is a failure the model can read; it is not repeated.
    const declined = (await guarded.callTool({ ...call, name: `${name}_declined` })) as CallToolResult;
    assert.equal(declined.isError, true);
    assert.equal(envelopeOf(declined)["code"], "card_declined");
    await close();
  });

  test("a call that needs a person answers with the page; once approved, calling again runs it once", async () => {
    const { name, refunds, guarded, close } = await connected({ mode: "always" });
    const call = { name, arguments: { payment_id: "pay_3", amount_cents: 70000 } };
    const waiting = (await guarded.callTool(call)) as CallToolResult;
    assert.equal(waiting.isError, true);
    const envelope = envelopeOf(waiting);
    assert.equal(envelope["status"], "awaiting_approval");
    const url = String(envelope["approval_url"]);
    assert.match(String(envelope["next_step"]), /same arguments/);
    const approval = /\/approvals\/([^/]+)\/$/.exec(url)![1]!;
    assert.equal(refunds.committed.length, 0);
    await decide(approval, true, "ok");
    const done = (await guarded.callTool(call)) as CallToolResult;
    assert.equal(done.isError, false);
    assert.equal(envelopeOf(done)["status"], "succeeded");
    await guarded.callTool(call);
    assert.equal(refunds.committed.length, 1);
    await close();
  });

  test("a rejection answers isError with the reviewer's comment; nothing runs", async () => {
    const { name, refunds, guarded, close } = await connected({ mode: "always" });
    const call = { name, arguments: { payment_id: "pay_4", amount_cents: 90000 } };
    const waiting = (await guarded.callTool(call)) as CallToolResult;
    const approval = /\/approvals\/([^/]+)\/$/.exec(String(envelopeOf(waiting)["approval_url"]))![1]!;
    await decide(approval, false, "Refunded by phone already");
    const rejected = (await guarded.callTool(call)) as CallToolResult;
    assert.equal(rejected.isError, true);
    assert.equal(envelopeOf(rejected)["status"], "rejected");
    assert.match(String(envelopeOf(rejected)["message"]), /Refunded by phone already/);
    assert.equal(refunds.committed.length, 0);
    await close();
  });
});
