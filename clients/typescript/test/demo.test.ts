// DemoProvider (@effectgate/client/demo), the quick start's stand-in payment provider:
// its protocol over real HTTP, and a Runner's refund through it against the live server
// tests/client_ts started.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { request } from "node:http";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { DemoProvider, MAX_BODY_BYTES, MAX_KEY_LENGTH, MAX_REFUNDS } from "../src/demo.js";
import { Failed, Runner, Succeeded, type AttemptContext } from "../src/index.js";
import { liveClient, refundContract, toolName } from "./support.js";

async function post(
  provider: DemoProvider,
  path: string,
  body: unknown,
  key: string | null = "key-1",
): Promise<{ status: number; body: Record<string, unknown> }> {
  const headers: Record<string, string> = { "Content-Type": "application/json" };
  if (key !== null) headers["Idempotency-Key"] = key;
  const text = typeof body === "string" ? body : JSON.stringify(body);
  const response = await fetch(`${provider.url}${path}`, { method: "POST", headers, body: text });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

async function get(provider: DemoProvider, path: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(`${provider.url}${path}`);
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

/** A POST whose body is sent in chunks, without a Content-Length. */
function postChunked(provider: DemoProvider, chunks: Buffer[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(
      `${provider.url}/refunds`,
      { method: "POST", headers: { "Content-Type": "application/json", "Idempotency-Key": "big" } },
      (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      },
    );
    // The provider may close the connection while the rest is still being sent.
    req.on("error", (error: NodeJS.ErrnoException) => {
      if (error.code !== "EPIPE" && error.code !== "ECONNRESET") reject(error);
    });
    for (const chunk of chunks) req.write(chunk);
    req.end();
  });
}

describe("the provider's protocol", () => {
  test("one refund per idempotency key; a repeat answers it and commits nothing", async () => {
    const provider = await DemoProvider.start();
    try {
      assert.match(provider.url, /^http:\/\/127\.0\.0\.1:\d+$/);
      const first = await post(provider, "/refunds", { payment_id: "pay_1", amount_cents: 500 }, "k1");
      assert.equal(first.status, 200);
      assert.deepEqual(first.body, { id: "re_0000001", status: "succeeded", payment_id: "pay_1", amount_cents: 500 });
      // The same key with other arguments: the refund already made, as providers do.
      const again = await post(provider, "/refunds", { payment_id: "pay_9", amount_cents: 9 }, "  k1 ");
      assert.deepEqual(again, first);
      const other = await post(provider, "/refunds", { payment_id: "pay_2", amount_cents: 700 }, "k2");
      assert.equal(other.body["id"], "re_0000002");
      assert.deepEqual([...provider.refunds.keys()], ["k1", "k2"]);
      assert.deepEqual(provider.refunds.get("k1"), first.body);
    } finally {
      await provider.close();
    }
  });

  test("a key over 255 characters is 400; a new key once 10 000 refunds are kept is 429", async () => {
    const provider = await DemoProvider.start();
    try {
      assert.equal(MAX_KEY_LENGTH, 255);
      assert.equal(MAX_REFUNDS, 10_000);
      const body = { payment_id: "pay_1", amount_cents: 500 };
      assert.equal((await post(provider, "/refunds", body, "k".repeat(256))).status, 400);
      assert.equal(provider.refunds.size, 0);
      assert.equal((await post(provider, "/refunds", body, "k".repeat(255))).status, 200);
      for (let i = provider.refunds.size; i < MAX_REFUNDS; i++) {
        provider.refund({ key: `filled-${i}`, paymentId: "pay_1", amountCents: 1 });
      }
      const refused = await post(provider, "/refunds", body, "one-too-many");
      assert.equal(refused.status, 429);
      assert.equal(provider.refunds.size, MAX_REFUNDS);
      assert.equal(provider.refunds.has("one-too-many"), false);
      // A key it holds still answers its refund.
      const again = await post(provider, "/refunds", body, "k".repeat(255));
      assert.deepEqual(again.body["id"], "re_0000001");
    } finally {
      await provider.close();
    }
  });

  test("lookups answer committed with the refund's id, or not_found", async () => {
    const provider = await DemoProvider.start();
    try {
      assert.equal(provider.lookupTemplate, `${provider.url}/refunds/lookup/{idempotency_key}`);
      await post(provider, "/refunds", { payment_id: "pay_1", amount_cents: 500 }, "order 1/refund");
      const committed = await get(provider, `/refunds/lookup/${encodeURIComponent("order 1/refund")}`);
      assert.equal(committed.status, 200);
      assert.deepEqual(committed.body, {
        result: "committed",
        downstream_id: "re_0000001",
        evidence: { id: "re_0000001", status: "succeeded", payment_id: "pay_1", amount_cents: 500 },
      });
      assert.deepEqual(provider.lookup("order 1/refund"), committed.body);
      const missing = await get(provider, "/refunds/lookup/never-sent");
      assert.deepEqual(missing, { status: 200, body: { result: "not_found", evidence: { provider: "demo" } } });
      assert.equal((await get(provider, "/refunds")).status, 404);
    } finally {
      await provider.close();
    }
  });

  test("a body it cannot read is 400, a missing key 428, another path 404; nothing is committed", async () => {
    const provider = await DemoProvider.start();
    try {
      for (const body of [
        "not json",
        "[1, 2]",
        "null",
        { payment_id: "pay_1" },
        { payment_id: "", amount_cents: 5 },
        { payment_id: 7, amount_cents: 5 },
        { payment_id: "pay_1", amount_cents: 0 },
        { payment_id: "pay_1", amount_cents: 1.5 },
        { payment_id: "pay_1", amount_cents: true },
        { payment_id: "pay_1", amount_cents: "500" },
      ]) {
        const answer = await post(provider, "/refunds", body);
        assert.equal(answer.status, 400, JSON.stringify(body));
        assert.match(String(answer.body["error"]), /payment_id/);
      }
      const refund = { payment_id: "pay_1", amount_cents: 500 };
      assert.equal((await post(provider, "/refunds", refund, null)).status, 428);
      assert.equal((await post(provider, "/refunds", refund, "   ")).status, 428);
      assert.equal((await post(provider, "/charges", refund)).status, 404);
      const put = await fetch(`${provider.url}/refunds`, { method: "PUT", body: "{}" });
      assert.equal(put.status, 405);
      await put.body?.cancel();
      assert.equal(provider.refunds.size, 0);
    } finally {
      await provider.close();
    }
  });

  test("bodies are bounded at 16 KiB, declared or streamed; the provider serves on", async () => {
    const provider = await DemoProvider.start();
    try {
      assert.equal(MAX_BODY_BYTES, 16 * 1024);
      const padded = (size: number) => {
        const body = { payment_id: "pay_1", amount_cents: 500, note: "" };
        body.note = "x".repeat(size - JSON.stringify(body).length);
        return JSON.stringify(body);
      };
      assert.equal(padded(MAX_BODY_BYTES).length, MAX_BODY_BYTES);
      assert.equal((await post(provider, "/refunds", padded(MAX_BODY_BYTES), "at-bound")).status, 200);
      const over = await post(provider, "/refunds", padded(MAX_BODY_BYTES + 1), "over");
      assert.equal(over.status, 413);
      assert.match(String(over.body["error"]), /16384 bytes/);
      // Chunked, with no Content-Length: refused once the bound is passed.
      assert.equal(await postChunked(provider, Array.from({ length: 64 }, () => Buffer.alloc(1024, 0x20))), 413);
      assert.deepEqual([...provider.refunds.keys()], ["at-bound"]);
      assert.equal((await post(provider, "/refunds", { payment_id: "pay_2", amount_cents: 1 }, "after")).status, 200);
    } finally {
      await provider.close();
    }
  });

  test("close() stops it; started and left open, it does not keep the process alive", async () => {
    const provider = await DemoProvider.start();
    const url = provider.url;
    await post(provider, "/refunds", { payment_id: "pay_1", amount_cents: 500 });
    await provider.close();
    await assert.rejects(fetch(`${url}/refunds/lookup/key-1`), TypeError);

    // A script that uses it and never closes it exits by itself, as the Python one's
    // daemon thread lets its process exit (the timeout only bounds a hang).
    const demo = fileURLToPath(new URL("../src/demo.ts", import.meta.url));
    const script = [
      `const { DemoProvider } = await import(${JSON.stringify(demo)});`,
      "const provider = await DemoProvider.start();",
      'const answer = await fetch(provider.url + "/refunds/lookup/x");',
      "console.log((await answer.json()).result);",
    ].join("\n");
    const done = spawnSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
      encoding: "utf-8",
      timeout: 60_000,
    });
    assert.equal(done.signal, null, "the process did not exit by itself");
    assert.equal(done.status, 0, done.stderr);
    assert.equal(done.stdout.trim(), "not_found");
  });
});

describe("a Runner's refund through it (live server)", () => {
  test("the quick start's call: one refund, and a replay answers it without calling", async () => {
    const provider = await DemoProvider.start();
    try {
      const client = liveClient();
      const tool = toolName("ts_demo_refund");
      await client.putTool(tool, refundContract("irreversible"));
      const runner = new Runner(client, { leaseS: 30 });
      const calls: number[] = [];
      const call = async (ctx: AttemptContext) => {
        calls.push(ctx.attempt);
        const response = await fetch(`${provider.url}/refunds`, {
          method: "POST",
          headers: { "Content-Type": "application/json", "Idempotency-Key": ctx.idempotencyKey },
          body: JSON.stringify(ctx.arguments),
          signal: ctx.signal,
        });
        if (response.status >= 400) throw new Failed(`http_${response.status}`, await response.text());
        const refund = (await response.json()) as { id: string };
        return new Succeeded({ result: refund, downstreamId: refund.id });
      };
      const run = await client.createRun({ principal: "user:alice" });
      const execute = () =>
        runner.execute({
          run: run.id,
          tool,
          operationKey: `${tool}:order-1`,
          arguments: { payment_id: "pay_1", amount_cents: 500 },
          call,
        });
      const first = await execute();
      const again = await execute();

      assert.equal(first.status, "succeeded");
      assert.deepEqual(first.forModel()["result"], { id: "re_0000001", status: "succeeded", payment_id: "pay_1", amount_cents: 500 });
      assert.deepEqual(again.forModel(), first.forModel());
      assert.deepEqual(calls, [1]);
      assert.equal(provider.refunds.size, 1);
      const [key] = provider.refunds.keys();
      const operation = await client.getOperation(first.operation.id);
      assert.equal(operation.downstream_id, "re_0000001");
      assert.equal(provider.lookup(key!).result, "committed");
    } finally {
      await provider.close();
    }
  });
});
