// The chaos bench's TypeScript runners (bench/chaos_ts.py drives them): one process is
// one runner worker, which takes refunds one at a time from stdin and answers each on
// stdout, as a JSON line each way.
//
//   in:  {"ref": "pay_000017", "amount_cents": 729, "run": "run_..."}
//   out: {"ref": "pay_000017", "answer": "succeeded", "stats": {"status:429": 1}}
//
// The worker's mode comes from CHAOS_TS_CONFIG (JSON):
//
// - "naive": POST the refund to the provider; on any error or status other than 200,
//   wait a little and send it again (at most 10 tries), as hand-written agent loops do.
// - "effectgate": `Runner.execute` of @effectgate/client (clients/typescript/dist) with
//   the operation key `<key_prefix><ref>`, sending the operation's idempotency key to
//   the provider.
//
// The fault `runner_crash` ends the process right after the provider answered, as a
// runner that died there would: nothing more is sent (no outcome, no heartbeat), and the
// harness delivers the refund again to a new process. Exit status 75 says "crashed";
// any other ending is an error of this script, which the harness reports.

import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

const CRASHED = 75;
const MAX_TRIES = 10;
const config = JSON.parse(process.env.CHAOS_TS_CONFIG ?? "{}");
const timeoutMs = Math.round(config.timeout_s * 1000);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The client is imported only by the Effectgate runner: the naive loop needs nothing
// but node's fetch.
const eg =
  config.mode === "effectgate" ? await import(pathToFileURL(config.client_module).href) : null;

/** One refund request to the provider, with the caller's idempotency key if any; the
 * process ends here when the provider says this runner crashes. */
async function refund(job, idempotencyKey) {
  const headers = { "Content-Type": "application/json" };
  if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
  const response = await fetch(`${config.provider_url}/refunds`, {
    method: "POST",
    headers,
    body: JSON.stringify({ payment_id: job.ref, amount_cents: job.amount_cents }),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await response.text();
  if (response.headers.get("X-Fault") === "runner_crash") process.exit(CRASHED);
  return { status: response.status, text };
}

async function naive(job) {
  for (let tries = 0; tries < MAX_TRIES; tries++) {
    try {
      const { status } = await refund(job, null);
      if (status === 200) return "succeeded";
    } catch {
      // Any error: try again, the way a loop that does not know what happened does.
    }
    await sleep(Math.min(1000, 50 * 2 ** tries));
  }
  return "gave_up";
}

function effectgateRunner() {
  const client = new eg.EffectgateClient({
    baseUrl: config.base_url,
    token: config.token,
    timeoutMs: 30_000,
  });
  const runner = new eg.Runner(client, {
    leaseS: config.lease_s,
    waitS: Math.max(10, 4 * config.lease_s),
    waiter: new eg.PollingWaiter({ initialS: 0.2, maxS: 1.0 }),
    // A heartbeat that finds its lease gone is expected here; the table counts it.
    log: () => {},
  });

  async function call(job, ctx) {
    let answer;
    try {
      answer = await refund(job, ctx.idempotencyKey);
    } catch (error) {
      throw eg.outcomeFromFetchError(error, config.provider_url);
    }
    if (answer.status === 503) throw new eg.Failed("provider_unavailable", "503: not processed");
    if (answer.status !== 200) {
      throw new eg.Failed(`http_${answer.status}`, answer.text.slice(0, 200));
    }
    const refundId = JSON.parse(answer.text).id;
    return new eg.Succeeded({ result: { refund: refundId }, downstreamId: refundId });
  }

  async function execute(job) {
    try {
      const result = await runner.execute({
        run: job.run,
        tool: config.tool,
        operationKey: config.key_prefix + job.ref,
        arguments: { payment_id: job.ref, amount_cents: job.amount_cents },
        call: (ctx) => call(job, ctx),
      });
      return result.status;
    } catch (error) {
      if (error instanceof eg.OutcomeNotRecorded) return "outcome_not_recorded";
      if (error instanceof eg.EffectgateError) return `error:${error.constructor.name}`;
      throw error;
    }
  }

  return { job: execute, stats: () => Object.fromEntries(client.stats) };
}

const worker = eg ? effectgateRunner() : { job: naive, stats: () => ({}) };
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const job = JSON.parse(line);
  const answer = await worker.job(job);
  process.stdout.write(`${JSON.stringify({ ref: job.ref, answer, stats: worker.stats() })}\n`);
}
