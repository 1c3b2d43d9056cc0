// Compile-time checks of `ToolContract` (src/types.ts), run by `npm run typecheck`
// (tests/client_ts: test_the_package_compiles_strict); nothing here runs. The generated
// body types `input_schema` as `Record<string, never>` (the OpenAPI document declares an
// object with no members: any JSON Schema); ToolContract takes any JSON Schema object
// there, and keeps the rest of the body as strict as generated.

import type { ToolContract } from "../src/index.js";

// A nested JSON Schema literal, with arrays, nested objects, $defs and $ref, type-checks.
export const nested: ToolContract = {
  effect_class: "irreversible",
  input_schema: {
    $schema: "https://json-schema.org/draft/2020-12/schema",
    type: "object",
    required: ["payment_id", "amount_cents", "lines"],
    properties: {
      payment_id: { type: "string", pattern: "^pay_", "x-sensitive": false },
      amount_cents: { type: "integer", minimum: 1, maximum: 1_000_000 },
      currency: { enum: ["eur", "usd"], default: "eur" },
      lines: {
        type: "array",
        minItems: 1,
        items: { $ref: "#/$defs/line" },
      },
      note: { oneOf: [{ type: "string", maxLength: 500 }, { type: "null" }] },
    },
    $defs: {
      line: {
        type: "object",
        properties: { sku: { type: "string" }, quantity: { type: "integer", minimum: 1 } },
        required: ["sku"],
        additionalProperties: false,
      },
    },
    additionalProperties: false,
  },
  retry: { max_attempts: 3, retryable_codes: ["rate_limited"] },
  approval: { mode: "rules", rules: [{ path: "/amount_cents", op: "gt", value: 50000 }] },
  reconcile: { mode: "manual" },
};

// A schema built elsewhere, `as const` and all, fits too.
const schema = {
  type: "object",
  properties: { invoice_id: { type: "string" } },
  required: ["invoice_id"],
} as const;
export const fromConstant: ToolContract = { effect_class: "idempotent", input_schema: schema };

// The rest stays strict.
export const refused: ToolContract[] = [
  // @ts-expect-error: the schema is an object, not a string
  { effect_class: "irreversible", input_schema: "object" },
  // @ts-expect-error: a contract has a schema
  { effect_class: "irreversible" },
  // @ts-expect-error: no such effect class
  { effect_class: "sometimes", input_schema: {} },
  // @ts-expect-error: a misspelt member is refused, not ignored
  { effect_class: "irreversible", input_schema: {}, aproval: { mode: "always" } },
  // @ts-expect-error: no such approval mode
  { effect_class: "irreversible", input_schema: {}, approval: { mode: "sometimes" } },
  // @ts-expect-error: retries are counted in numbers
  { effect_class: "irreversible", input_schema: {}, retry: { max_attempts: "3" } },
];
