/**
 * The receiver: verify the raw bytes, claim the `webhook-id`, run the handler once, answer.
 *
 * | delivery | answer |
 * | --- | --- |
 * | missing, tampered or stale signature | 401 (verdict stops: any 4xx but 429 is final) |
 * | signed, but not an envelope | 400 |
 * | over the size limit | 413 |
 * | new: the handler ran | 204 |
 * | already processed | 204, the handler not called again |
 * | being handled by another request now | 503 with `Retry-After` (verdict retries) |
 * | the handler threw | 500: the claim is released, so verdict's retry is handled afresh |
 */

import { Webhook } from "standardwebhooks";

import { parseEnvelope, type Envelope } from "./models.js";
import { MemoryDedupStore, type DedupStore } from "./store.js";

/** The largest body accepted: 1 MiB. verdict's envelopes are a few KiB. */
export const DEFAULT_MAX_BODY_BYTES = 1024 * 1024;
/** How long a running handler holds its delivery before another may take it over: 5 minutes. */
export const DEFAULT_HANDLER_LEASE_SECONDS = 300;
/** What an in-flight duplicate is told to wait, in seconds. */
export const IN_FLIGHT_RETRY_AFTER_SECONDS = 5;

/** A verified callback, handed to the handler once. */
export interface Delivery {
  webhookId: string;
  envelope: Envelope;
  /** The body exactly as received and verified. */
  body: Buffer;
}

export type Handler = (delivery: Delivery) => void | Promise<void>;

/** The HTTP answer to give verdict. */
export interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** Header values as Node and Express hand them over. */
export type IncomingHeaders = Record<string, string | string[] | undefined>;

export interface ReceiverOptions {
  /** Default: a {@link MemoryDedupStore}, which forgets on restart. */
  store?: DedupStore;
  handlerLeaseSeconds?: number;
  maxBodyBytes?: number;
  /** Now, in unix seconds. */
  clock?: () => number;
}

/** The delivery is not signed by any of the receiver's secrets, or not recently. */
export class InvalidSignatureError extends Error {
  override name = "InvalidSignatureError";
}

/** Verifies verdict callbacks with the tenant's webhook secrets and handles each id once. */
export class Receiver {
  readonly maxBodyBytes: number;
  readonly #webhooks: Webhook[];
  readonly #store: DedupStore;
  readonly #leaseSeconds: number;
  readonly #clock: () => number;

  /** `secrets`: the tenant's webhook secret, or the old and the new one during a rotation. */
  constructor(secrets: string | string[], options: ReceiverOptions = {}) {
    const names = typeof secrets === "string" ? [secrets] : secrets;
    if (names.length === 0) throw new RangeError("no webhook secret: add the tenant's (old and new during rotation)");
    this.#webhooks = names.map((secret) => new Webhook(secret));
    this.#store = options.store ?? new MemoryDedupStore();
    this.#leaseSeconds = options.handlerLeaseSeconds ?? DEFAULT_HANDLER_LEASE_SECONDS;
    this.maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
    this.#clock = options.clock ?? (() => Date.now() / 1000);
  }

  /** The delivery, if one secret signed these exact bytes within the last 5 minutes. */
  verify(headers: IncomingHeaders, body: Buffer): Delivery {
    const lowered = singleValued(headers);
    let failure: unknown = new InvalidSignatureError("no secret matched");
    const verified = this.#webhooks.some((webhook) => {
      try {
        webhook.verify(body, lowered, { jsonParse: false });
        return true;
      } catch (error) {
        failure = error;
        return false;
      }
    });
    if (!verified) throw new InvalidSignatureError(failure instanceof Error ? failure.message : String(failure));
    const envelope = parseEnvelope(JSON.parse(body.toString("utf8")));
    return { webhookId: lowered["webhook-id"] ?? "", envelope, body };
  }

  /** Verifies, claims and handles one delivery; returns what to answer. */
  async receive(headers: IncomingHeaders, body: Buffer, handler: Handler): Promise<Answer> {
    if (body.length > this.maxBodyBytes) return plain(413, "payload too large");
    let delivery: Delivery;
    try {
      delivery = this.verify(headers, body);
    } catch (error) {
      if (error instanceof InvalidSignatureError) return plain(401, `invalid signature: ${error.message}`);
      return plain(400, `not a verdict envelope: ${error instanceof Error ? error.message : String(error)}`);
    }
    const now = this.#clock();
    const claim = await this.#store.claim(delivery.webhookId, now, now + this.#leaseSeconds);
    if (claim === "duplicate") return { status: 204, headers: {}, body: "" };
    if (claim === "in_flight") {
      return { status: 503, headers: { "Retry-After": String(IN_FLIGHT_RETRY_AFTER_SECONDS) }, body: "in progress" };
    }
    try {
      await handler(delivery);
    } catch {
      await this.#store.release(delivery.webhookId);
      return plain(500, "handler failed");
    }
    await this.#store.markProcessed(delivery.webhookId, this.#clock());
    return { status: 204, headers: {}, body: "" };
  }
}

/** Lower-cased names, one value each: the form the reference library reads. */
function singleValued(headers: IncomingHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined) out[name.toLowerCase()] = Array.isArray(value) ? value.join(", ") : value;
  }
  return out;
}

function plain(status: number, body: string): Answer {
  return { status, headers: { "Content-Type": "text/plain; charset=utf-8" }, body };
}
