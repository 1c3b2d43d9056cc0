// verifyWebhook against a delivery the server's own signing code signed
// (operations/signing.py, run by tests/client_ts with a fresh secret).

import assert from "node:assert/strict";
import { test } from "node:test";

import { WebhookVerificationError, verifyWebhook, webhookOperationId } from "../src/index.js";

interface Vector {
  secret: string;
  headers: Record<string, string>;
  /** The same delivery signed (by the server's code) an hour ago and an hour ahead. */
  old: Record<string, string>;
  future: Record<string, string>;
  body: string;
}

function vector(): Vector {
  const text = process.env["EFFECTGATE_WEBHOOK_VECTOR"];
  assert.ok(text, "EFFECTGATE_WEBHOOK_VECTOR: a delivery signed by the server's code");
  return JSON.parse(text) as Vector;
}

test("a delivery the server signed verifies, and its operation is named", () => {
  const { secret, headers, body } = vector();
  const event = verifyWebhook(secret, body, headers);
  assert.equal(event.type, "approval.decided");
  assert.equal(webhookOperationId(event), "op_vector");
  // Node's IncomingHttpHeaders and a Headers object work alike; bytes as well as text.
  const again = verifyWebhook(secret, new TextEncoder().encode(body), new Headers(headers));
  assert.deepEqual(again, event);
});

test("a changed body, another secret or a missing signature is refused", () => {
  const { secret, headers, body } = vector();
  assert.throws(() => verifyWebhook(secret, body.replace("op_vector", "op_other"), headers), WebhookVerificationError);
  const other = "whsec_" + Buffer.alloc(32, 7).toString("base64");
  assert.throws(() => verifyWebhook(other, body, headers), WebhookVerificationError);
  const { "webhook-signature": _dropped, ...unsigned } = headers;
  assert.throws(() => verifyWebhook(secret, body, unsigned), WebhookVerificationError);
});

test("a delivery properly signed an hour ago or an hour ahead is refused for its timestamp", () => {
  const { secret, old, future, body } = vector();
  // The signatures are good: only the timestamps are out of the tolerance.
  assert.throws(
    () => verifyWebhook(secret, body, old),
    (e: unknown) => e instanceof WebhookVerificationError && /too old/.test(e.message),
  );
  assert.throws(
    () => verifyWebhook(secret, body, future),
    (e: unknown) => e instanceof WebhookVerificationError && /too new/.test(e.message),
  );
});
