// What the framework guard tests share: the live server and runner token pytest gave
// (tests/client_ts/test_typescript_guards.py), tool names of their own, a refund
// contract, a refund tool that counts its effects, and decisions made by a person on the
// Python side (the runner token cannot decide: separation of duties).

import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { EffectgateClient, Runner, type ToolContract } from "../src/index.js";

function need(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these tests from tests/client_ts`);
  return value;
}

export function liveRunner(): Runner {
  const client = new EffectgateClient({ baseUrl: need("EFFECTGATE_URL"), token: need("EFFECTGATE_TOKEN"), backoffBaseMs: 5 });
  return new Runner(client, { waitS: 20 });
}

/** A tool name of this test's own (tool names are global on a server). */
export function toolName(prefix: string): string {
  return `${prefix}_${randomBytes(4).toString("hex")}`;
}

export function refundContract(overrides: Partial<ToolContract> = {}): ToolContract {
  return {
    effect_class: "irreversible",
    input_schema: {
      type: "object",
      required: ["payment_id", "amount_cents"],
      properties: { payment_id: { type: "string" }, amount_cents: { type: "integer", minimum: 1 } },
      additionalProperties: false,
    },
    approval: { mode: "never" },
    ...overrides,
  } as ToolContract;
}

/** A fake payment provider: every refund it commits, with the key it was sent. */
export class Refunds {
  readonly committed: { payment_id: string; amount_cents: number; key: string | undefined }[] = [];

  refund(payment_id: string, amount_cents: number, key: string | undefined): string {
    this.committed.push({ payment_id, amount_cents, key });
    return `re_${this.committed.length}`;
  }
}

/** A person decides on an approval: pytest does it with operations.services and says
 * when it is done (a request file and an answer file in EFFECTGATE_DECISIONS). `edits`
 * (JSON pointer to value) approves with changes, for fields the contract makes editable. */
export async function decide(
  approvalId: string,
  approve: boolean,
  comment: string,
  edits?: Record<string, unknown>,
): Promise<void> {
  const dir = need("EFFECTGATE_DECISIONS");
  const request = join(dir, `${approvalId}.json`);
  writeFileSync(`${request}.tmp`, JSON.stringify({ approval: approvalId, approve, comment, edits: edits ?? null }));
  // Renamed into place so that pytest never reads half a file.
  renameSync(`${request}.tmp`, request);
  for (let waited = 0; waited < 30_000; waited += 50) {
    if (existsSync(join(dir, `${approvalId}.done`))) return;
    const failed = join(dir, `${approvalId}.error`);
    if (existsSync(failed)) throw new Error(`the decision failed: ${readFileSync(failed, "utf8")}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`nobody decided ${approvalId} within 30 s`);
}
