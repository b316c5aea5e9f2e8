/** The sender: one key and one body per signal, sent until verdict answers for good. */

import { randomUUID } from "node:crypto";
import { Webhook } from "standardwebhooks";

import { ConfigError, KeyReusedError, NetworkError, RejectedError, UnavailableError } from "./errors.js";
import { parseDecision, signalBytes, type Signal, type SignalOutcome } from "./models.js";
import { Backoff, dispositionOf, parseRetryAfter, waitBeforeRetry } from "./retry.js";

/** Attempts per signal unless configured: enough to ride out a short outage. */
export const DEFAULT_MAX_ATTEMPTS = 8;
/** Per-attempt deadline unless configured; ingest includes an inline callback of up to 5 s. */
export const DEFAULT_TIMEOUT_MS = 30_000;

export interface SenderOptions {
  /** The tenant's inbound secret (`whsec_…`); omit only if the tenant turned signatures off. */
  signingSecret?: string;
  /** Attempts per signal, the first included; default {@link DEFAULT_MAX_ATTEMPTS}. */
  maxAttempts?: number;
  backoff?: Backoff;
  timeoutMs?: number;
  /** How to wait between attempts, in seconds; a test records instead of sleeping. */
  sleep?: (seconds: number) => Promise<void>;
  /** Now, in unix seconds. */
  clock?: () => number;
}

interface Reply {
  status: number;
  retryAfter: number | undefined;
  replayed: boolean;
  body: unknown;
}

/** A fresh UUIDv4: random, never derived from the signal, so two signals are two keys. */
export function newIdempotencyKey(): string {
  return randomUUID();
}

/** 1 to 255 visible ASCII characters, as verdict's contract requires. */
export function isValidKey(key: string): boolean {
  return /^[\x21-\x7e]{1,255}$/.test(key);
}

/** `webhook-id`, `webhook-timestamp`, `webhook-signature`, signed by the npm reference library. */
export function standardWebhooksHeaders(
  secret: string,
  msgId: string,
  timestamp: number,
  body: Buffer,
): Record<string, string> {
  const signature = new Webhook(secret).sign(msgId, new Date(timestamp * 1000), body);
  return { "webhook-id": msgId, "webhook-timestamp": String(timestamp), "webhook-signature": signature };
}

/**
 * Sends signals to one verdict deployment as one tenant. Every signal gets one UUIDv4 key (its
 * `webhook-id` and `Idempotency-Key`) and is serialised once; each attempt posts those same
 * bytes, signed afresh with the tenant's inbound secret.
 */
export class Sender {
  readonly url: string;
  readonly #apiKey: string;
  readonly #secret: string | undefined;
  readonly #maxAttempts: number;
  readonly #backoff: Backoff;
  readonly #timeoutMs: number;
  readonly #sleep: (seconds: number) => Promise<void>;
  readonly #clock: () => number;

  constructor(baseUrl: string, apiKey: string, options: SenderOptions = {}) {
    if (!/^https?:\/\//.test(baseUrl)) throw new ConfigError("base URL must be http or https");
    const maxAttempts = options.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
    if (!Number.isInteger(maxAttempts) || maxAttempts < 1) throw new ConfigError("maxAttempts must be at least 1");
    const backoff = options.backoff ?? new Backoff();
    if (backoff.baseSeconds > backoff.maxSeconds) throw new ConfigError("backoff base must not exceed its maximum");
    // Refuses an empty or malformed secret now, not on every attempt.
    if (options.signingSecret !== undefined) {
      try {
        new Webhook(options.signingSecret);
      } catch {
        throw new ConfigError("the signing secret is not a whsec_ base64 secret");
      }
    }
    this.url = `${baseUrl.replace(/\/+$/, "")}/v1/signals`;
    this.#apiKey = apiKey;
    this.#secret = options.signingSecret;
    this.#maxAttempts = maxAttempts;
    this.#backoff = backoff;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.#sleep = options.sleep ?? ((seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000)));
    this.#clock = options.clock ?? (() => Math.floor(Date.now() / 1000));
  }

  /** Serialises `signal` once and sends it under a fresh key. */
  send(signal: Signal): Promise<SignalOutcome> {
    return this.sendBytes(signalBytes(signal));
  }

  /** Sends a serialised signal under a fresh key, retrying with the same key and bytes. */
  sendBytes(body: Buffer): Promise<SignalOutcome> {
    return this.#send(body, newIdempotencyKey());
  }

  /**
   * Sends again a signal whose earlier send gave up: the key from that error, the same bytes.
   * With a new key verdict would decide the signal a second time if the first send got through.
   */
  resend(body: Buffer, idempotencyKey: string): Promise<SignalOutcome> {
    if (!isValidKey(idempotencyKey)) {
      return Promise.reject(new ConfigError("invalid idempotency key: it must be 1 to 255 visible ASCII characters"));
    }
    return this.#send(body, idempotencyKey);
  }

  async #send(body: Buffer, key: string): Promise<SignalOutcome> {
    for (let attempts = 1; ; attempts++) {
      const retry = attempts - 1;
      const last = attempts >= this.#maxAttempts;
      let reply: Reply;
      try {
        reply = await this.#attempt(body, key);
      } catch (error) {
        if (last) throw new NetworkError(attempts, key, error);
        await this.#sleep(this.#backoff.delay(retry));
        continue;
      }
      const disposition = dispositionOf(reply.status);
      switch (disposition) {
        case "accepted":
          return {
            status: reply.status,
            decision: parseDecision(reply.body),
            replayed: reply.replayed,
            idempotencyKey: key,
            attempts,
          };
        case "key_reused":
          throw new KeyReusedError(key, reply.body);
        case "rejected":
          throw new RejectedError(reply.status, reply.body);
        default:
          if (last) throw new UnavailableError(reply.status, attempts, key, reply.body);
          await this.#sleep(waitBeforeRetry(disposition, reply.retryAfter, this.#backoff, retry));
      }
    }
  }

  /** One POST of the same bytes under the same key. */
  async #attempt(body: Buffer, key: string): Promise<Reply> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.#apiKey}`,
      "Content-Type": "application/json",
      "Idempotency-Key": key,
    };
    if (this.#secret !== undefined) {
      // A fresh timestamp per attempt, so a retry after minutes is not refused as stale.
      Object.assign(headers, standardWebhooksHeaders(this.#secret, key, this.#clock(), body));
    }
    const response = await fetch(this.url, {
      method: "POST",
      headers,
      body,
      // A redirected POST may become a GET or go elsewhere; the endpoint does not move.
      redirect: "manual",
      signal: AbortSignal.timeout(this.#timeoutMs),
    });
    // If the body is lost after a 2xx, the retry gets the stored answer replayed: safe.
    const text = await response.text();
    return {
      status: response.status,
      retryAfter: parseRetryAfter(response.headers.get("retry-after")),
      replayed: response.headers.get("idempotent-replayed")?.trim().toLowerCase() === "true",
      body: parseBody(text),
    };
  }
}

/** A response body as JSON; `undefined` when empty, the text when not JSON. */
function parseBody(text: string): unknown {
  if (text === "") return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
