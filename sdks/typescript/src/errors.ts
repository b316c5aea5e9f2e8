/** Why a signal was not accepted. Messages never carry the API key, the secret or the body. */

/** Base of every error the sender raises. */
export class VerdictError extends Error {
  override name = "VerdictError";
}

/** The sender was given something unusable. */
export class ConfigError extends VerdictError {
  override name = "ConfigError";
}

/** 422: verdict already holds this idempotency key for a different body. */
export class KeyReusedError extends VerdictError {
  override name = "KeyReusedError";
  constructor(
    readonly idempotencyKey: string,
    readonly problem: unknown,
  ) {
    super(
      "the idempotency key was reused with a different body (422): a key-generation bug; " +
        "every signal needs a fresh random key, and a retry must resend the same bytes",
    );
  }
}

/** A 4xx other than 409, 422 and 429: the request is wrong and retrying will not help. */
export class RejectedError extends VerdictError {
  override name = "RejectedError";
  constructor(
    readonly status: number,
    readonly problem: unknown,
  ) {
    super(`verdict rejected the signal with status ${status}${title(problem)}`);
  }
}

/** Every attempt got a retryable status; resend later with the same key and bytes. */
export class UnavailableError extends VerdictError {
  override name = "UnavailableError";
  constructor(
    readonly status: number,
    readonly attempts: number,
    readonly idempotencyKey: string,
    readonly problem: unknown,
  ) {
    super(`verdict was unavailable: status ${status} after ${attempts} attempts${title(problem)}`);
  }
}

/** Every attempt failed in transport; resend later with the same key and bytes. */
export class NetworkError extends VerdictError {
  override name = "NetworkError";
  constructor(
    readonly attempts: number,
    readonly idempotencyKey: string,
    override readonly cause: unknown,
  ) {
    super(`could not reach verdict after ${attempts} attempts: ${String(cause)}`);
  }
}

/** `: <title>` when the problem document has one. */
function title(problem: unknown): string {
  const value = typeof problem === "object" && problem !== null ? (problem as { title?: unknown }).title : undefined;
  return typeof value === "string" ? `: ${value}` : "";
}
