/**
 * What each answer means, and how long to wait before the next attempt. Network errors, 5xx
 * and 429 back off exponentially with full jitter (the server's `Retry-After` is a floor); 409
 * (the same signal still in flight) waits `Retry-After`; 422 is a key-generation bug; any other
 * 4xx is final.
 */

/** Wait on 409 when the server gives no `Retry-After`, in seconds; the server sends 2 itself. */
export const DEFAULT_IN_FLIGHT_WAIT_SECONDS = 2;
/** The longest `Retry-After` honoured; a larger value waits this long instead. */
export const MAX_RETRY_AFTER_SECONDS = 60;

export type Disposition = "accepted" | "in_flight" | "key_reused" | "transient" | "rejected";

/** The next step a status calls for. */
export function dispositionOf(status: number): Disposition {
  if (status >= 200 && status < 300) return "accepted";
  if (status === 409) return "in_flight";
  if (status === 422) return "key_reused";
  // 429 is answered before the key is claimed, so retrying is safe and expected.
  if (status === 429 || status >= 500) return "transient";
  return "rejected";
}

/** Full jitter: retry `n` waits a uniform time in `[0, min(max, base * 2^n)]`, in seconds. */
export class Backoff {
  constructor(
    readonly baseSeconds = 0.25,
    readonly maxSeconds = 30,
  ) {}

  ceiling(retry: number): number {
    return Math.min(this.maxSeconds, this.baseSeconds * 2 ** Math.min(retry, 62));
  }

  delay(retry: number): number {
    // Full jitter spreads out senders that failed together, so they do not retry in lockstep.
    return Math.random() * this.ceiling(retry);
  }
}

/** `Retry-After` in delta-seconds; an HTTP date or anything else counts as absent. */
export function parseRetryAfter(value: string | null): number | undefined {
  const text = value?.trim() ?? "";
  return /^\d+$/.test(text) ? Number(text) : undefined;
}

/** Seconds to wait before retry number `retry` (0 for the first retry). */
export function waitBeforeRetry(
  disposition: Disposition,
  retryAfter: number | undefined,
  backoff: Backoff,
  retry: number,
): number {
  const capped = retryAfter === undefined ? undefined : Math.min(retryAfter, MAX_RETRY_AFTER_SECONDS);
  if (disposition === "in_flight") return capped ?? DEFAULT_IN_FLIGHT_WAIT_SECONDS;
  // The server's hint is a floor: never retry sooner than it asked.
  return Math.max(backoff.delay(retry), capped ?? 0);
}
