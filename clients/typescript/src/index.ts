export * from "./errors.js";
export * from "./client.js";
export * from "./outcomes.js";
export * from "./runner.js";
export * from "./waiters.js";
export type * from "./types.js";
export * from "./webhooks.js";
