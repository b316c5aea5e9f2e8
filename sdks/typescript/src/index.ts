/**
 * verdict's SDK: send identity-risk signals exactly once, receive signed callbacks once.
 *
 * - {@link Sender}: one UUIDv4 key per signal, the same bytes on every retry, each attempt
 *   signed per Standard Webhooks with the tenant's inbound secret (`webhook-id` = the key).
 * - {@link Receiver}: verifies callbacks over the raw bytes, deduplicates on `webhook-id` in a
 *   {@link DedupStore} (in memory by default) and runs the handler once; `verdict-sdk/express`
 *   mounts it.
 */

export * from "./errors.js";
export * from "./models.js";
export * from "./receiver.js";
export * from "./retry.js";
export * from "./sender.js";
export * from "./store.js";
