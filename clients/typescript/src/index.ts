export * from "./errors.js";
export * from "./client.js";
export * from "./outcomes.js";
export type * from "./types.js";
