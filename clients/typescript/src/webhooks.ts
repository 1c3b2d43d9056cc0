// Standard Webhooks verification of Effectgate's deliveries (docs/api.md, Webhooks),
// with the `standardwebhooks` package: a `v1,` HMAC-SHA256 signature over
// `webhook-id.webhook-timestamp.body` under the endpoint's `whsec_...` secret, and a
// timestamp within five minutes. During a secret's rotation Effectgate signs with both
// secrets, so the new one verifies from the start.

import { Webhook, WebhookVerificationError as Refused } from "standardwebhooks";

import { EffectgateError } from "./errors.js";
import type { Approval, Operation } from "./types.js";

/** A delivery's body: `operation.*` and `approval.decided` events carry the operation
 * as it was when the change committed (a hint: re-read it from the API before acting). */
export interface WebhookEvent {
  type: string;
  timestamp: string;
  data: {
    operation?: Operation;
    approval?: Approval;
    [field: string]: unknown;
  };
}

/** The signature, the timestamp or the body of a delivery is not acceptable. */
export class WebhookVerificationError extends EffectgateError {}

type HeaderSource = Headers | Record<string, string | string[] | undefined>;

function header(headers: HeaderSource, name: string): string {
  if (headers instanceof Headers) return headers.get(name) ?? "";
  for (const [key, value] of Object.entries(headers)) {
    if (key.toLowerCase() === name) return Array.isArray(value) ? value.join(" ") : (value ?? "");
  }
  return "";
}

/** The event of a delivery whose signature verifies under `secret`; throws
 * `WebhookVerificationError` otherwise.
 *
 * `payload` is the body exactly as received (the raw text or bytes, never a re-encoded
 * JSON object: the signature covers the bytes); `headers` the request's headers (a
 * `Headers`, or Node's `IncomingHttpHeaders`), of which `webhook-id`,
 * `webhook-timestamp` and `webhook-signature` are read. */
export function verifyWebhook(
  secret: string,
  payload: string | Uint8Array,
  headers: HeaderSource,
): WebhookEvent {
  const wanted = {
    "webhook-id": header(headers, "webhook-id"),
    "webhook-timestamp": header(headers, "webhook-timestamp"),
    "webhook-signature": header(headers, "webhook-signature"),
  };
  let verified: unknown;
  try {
    const body = typeof payload === "string" ? payload : Buffer.from(payload);
    verified = new Webhook(secret).verify(body, wanted);
  } catch (error) {
    if (error instanceof Refused) throw new WebhookVerificationError(error.message, { cause: error });
    throw new WebhookVerificationError(`the delivery cannot be verified: ${String(error)}`, {
      cause: error,
    });
  }
  if (verified === null || typeof verified !== "object" || Array.isArray(verified)) {
    throw new WebhookVerificationError("the delivery's body is not an event object");
  }
  return verified as WebhookEvent;
}

/** The operation an event is about, if any: what to pass to `NotifiedWaiter.notify`. */
export function webhookOperationId(event: WebhookEvent): string | null {
  const id = event.data?.operation?.id;
  return typeof id === "string" ? id : null;
}
