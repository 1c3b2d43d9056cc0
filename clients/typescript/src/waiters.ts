// How a runner waits for an operation to leave a state (approval, reconciliation).
//
// A waiter answers one question: "tell me when operation X is no longer in state S, or
// when the deadline passes". `PollingWaiter` asks the API with capped exponential
// backoff. `NotifiedWaiter` sleeps until something calls `notify(operationId)`
// (typically the runner's webhook receiver, once `verifyWebhook` accepted an
// `operation.*` or `approval.decided` event) and falls back to slow polling, so a lost
// webhook delays the runner but never strands it. Both re-read the operation from the
// API after waking up: a notification says "look now", never what the new state is.

import type { EffectgateClient } from "./client.js";
import type { Operation } from "./types.js";

/** Milliseconds on a monotonic clock: what deadlines are measured in. */
export type Clock = () => number;
export const monotonic: Clock = () => performance.now();
export const sleep = (ms: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

export interface WaitOptions {
  /** The status to wait out (`awaiting_approval`, `outcome_unknown`). */
  status: string;
  /** When to stop waiting, on the waiter's clock (ms, `performance.now()` by default). */
  deadline: number;
}

export interface Waiter {
  /** The operation once its status is not `opts.status`, or as it is at the deadline. */
  wait(client: EffectgateClient, operationId: string, opts: WaitOptions): Promise<Operation>;
}

/** Poll `GET /operations/{id}` with capped exponential backoff and jitter, from
 * `initialS` up to `maxS` seconds between polls. */
export class PollingWaiter implements Waiter {
  readonly initialS: number;
  readonly maxS: number;
  readonly factor: number;
  polls = 0;
  readonly #sleep: (ms: number) => Promise<void>;
  readonly #clock: Clock;

  constructor(
    opts: {
      initialS?: number;
      maxS?: number;
      factor?: number;
      sleep?: (ms: number) => Promise<void>;
      clock?: Clock;
    } = {},
  ) {
    this.initialS = opts.initialS ?? 0.5;
    this.maxS = opts.maxS ?? 15;
    this.factor = opts.factor ?? 2;
    this.#sleep = opts.sleep ?? sleep;
    this.#clock = opts.clock ?? monotonic;
  }

  async wait(client: EffectgateClient, operationId: string, opts: WaitOptions): Promise<Operation> {
    let ceiling = this.initialS * 1000;
    for (;;) {
      const operation = await client.getOperation(operationId);
      this.polls += 1;
      const remaining = opts.deadline - this.#clock();
      if (operation.status !== opts.status || remaining <= 0) return operation;
      // Jitter spreads the polls of many runners waiting on one approver.
      const delay = ceiling / 2 + (Math.random() * ceiling) / 2;
      await this.#sleep(Math.min(delay, remaining));
      ceiling = Math.min(this.maxS * 1000, ceiling * this.factor);
    }
  }
}

/** Wait for `notify(operationId)`; poll every `fallbackPollS` seconds regardless. */
export class NotifiedWaiter implements Waiter {
  readonly fallbackPollS: number;
  readonly #clock: Clock;
  readonly #versions = new Map<string, number>();
  readonly #wakers = new Map<string, Set<() => void>>();

  constructor(opts: { fallbackPollS?: number; clock?: Clock } = {}) {
    this.fallbackPollS = opts.fallbackPollS ?? 30;
    this.#clock = opts.clock ?? monotonic;
  }

  /** Something about `operationId` changed: wake whoever waits for it. */
  notify(operationId: string): void {
    this.#versions.set(operationId, (this.#versions.get(operationId) ?? 0) + 1);
    for (const wake of this.#wakers.get(operationId) ?? []) wake();
  }

  async wait(client: EffectgateClient, operationId: string, opts: WaitOptions): Promise<Operation> {
    for (;;) {
      const seen = this.#versions.get(operationId) ?? 0;
      const operation = await client.getOperation(operationId);
      const remaining = opts.deadline - this.#clock();
      if (operation.status !== opts.status || remaining <= 0) return operation;
      // A notification that arrived while the GET was in flight counts: the version
      // moved, so the loop reads the operation again at once.
      if ((this.#versions.get(operationId) ?? 0) !== seen) continue;
      await new Promise<void>((resolve) => {
        let wakers = this.#wakers.get(operationId);
        if (wakers === undefined) {
          wakers = new Set();
          this.#wakers.set(operationId, wakers);
        }
        const done = (): void => {
          clearTimeout(timer);
          wakers.delete(done);
          if (wakers.size === 0) this.#wakers.delete(operationId);
          resolve();
        };
        const timer = setTimeout(done, Math.min(this.fallbackPollS * 1000, remaining));
        wakers.add(done);
      });
    }
  }
}
