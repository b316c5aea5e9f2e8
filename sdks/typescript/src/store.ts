/**
 * Where received `webhook-id`s are remembered, so a redelivery is recognised and answered 2xx
 * without running the handler again. A processed id is kept for the horizon (72 h by default),
 * well past verdict's retry schedule (one inline attempt, then 3 worker attempts 5 minutes
 * apart) and the hours or a weekend after which an operator may redeliver a dead delivery by
 * hand, with the same id.
 */

/** How long a processed id is remembered: 72 hours, in seconds. */
export const DEFAULT_HORIZON_SECONDS = 72 * 3600;
/** The shortest horizon accepted: an hour, past verdict's retries (about 20 minutes) with margin. */
export const MIN_HORIZON_SECONDS = 3600;
/** How often expired ids are pruned, opportunistically while claiming: hourly. */
export const PRUNE_INTERVAL_SECONDS = 3600;

/**
 * What claiming a `webhook-id` found: `new` (run the handler), `duplicate` (already processed:
 * answer 2xx) or `in_flight` (another delivery of it is being handled: ask verdict to retry).
 */
export type Claim = "new" | "duplicate" | "in_flight";

/**
 * A store the receiver claims ids in. A claim must be atomic for every receiver sharing the
 * store: implement it over a database's uniqueness check when several processes receive.
 */
export interface DedupStore {
  /** Claims `webhookId` at `now` for a handler holding it until `leaseUntil` (unix seconds). */
  claim(webhookId: string, now: number, leaseUntil: number): Promise<Claim>;
  markProcessed(webhookId: string, now: number): Promise<void>;
  /** Forgets an unprocessed claim, so verdict's retry is handled afresh. */
  release(webhookId: string): Promise<void>;
}

interface Row {
  receivedAt: number;
  leaseUntil: number;
  processedAt?: number;
}

/**
 * Ids in this process's memory: the default, for one process that accepts forgetting on
 * restart (a restarted receiver would handle a redelivery again). Use a durable store otherwise.
 */
export class MemoryDedupStore implements DedupStore {
  readonly #rows = new Map<string, Row>();
  readonly #horizonSeconds: number;
  #lastPrune = Number.NEGATIVE_INFINITY;

  constructor(horizonSeconds = DEFAULT_HORIZON_SECONDS) {
    if (horizonSeconds < MIN_HORIZON_SECONDS) {
      throw new RangeError(
        `the horizon must be at least ${MIN_HORIZON_SECONDS} s: shorter would forget ids verdict may still retry or redeliver`,
      );
    }
    this.#horizonSeconds = horizonSeconds;
  }

  async claim(webhookId: string, now: number, leaseUntil: number): Promise<Claim> {
    if (now - this.#lastPrune >= PRUNE_INTERVAL_SECONDS) {
      this.#lastPrune = now;
      this.prune(now);
    }
    const row = this.#rows.get(webhookId);
    if (row?.processedAt !== undefined) return "duplicate";
    // A handler whose lease ran out died mid-way: this delivery takes the event over.
    if (row !== undefined && row.leaseUntil > now) return "in_flight";
    this.#rows.set(webhookId, { receivedAt: now, leaseUntil });
    return "new";
  }

  async markProcessed(webhookId: string, now: number): Promise<void> {
    const row = this.#rows.get(webhookId);
    if (row !== undefined) row.processedAt = now;
  }

  async release(webhookId: string): Promise<void> {
    if (this.#rows.get(webhookId)?.processedAt === undefined) this.#rows.delete(webhookId);
  }

  /** Forgets processed ids older than the horizon; returns how many. */
  prune(now: number): number {
    let pruned = 0;
    for (const [id, row] of this.#rows) {
      if (row.processedAt !== undefined && row.receivedAt < now - this.#horizonSeconds) {
        this.#rows.delete(id);
        pruned++;
      }
    }
    return pruned;
  }
}
