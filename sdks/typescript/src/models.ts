/** The signal verdict takes, the decision it answers with, and the callback envelope it sends. */

export type SignalType = "sim_swap" | "port_out" | "credential_breach";
export type DecisionKind = "allow" | "step_up" | "deny" | "ignored";

/** Who the signal is about: a phone number in E.164 form, or an account id of the tenant's. */
export type Subject = { phone: string } | { account: string };

/** One identity-risk observation, the body of `POST /v1/signals`. */
export interface Signal {
  type: SignalType;
  subject: Subject;
  /** When it was observed; a `Date` is sent as RFC 3339 UTC. */
  observed_at: Date | string;
  attributes?: Record<string, unknown>;
  metadata?: Record<string, unknown>;
}

/** One action of a decision and how it went (`done`, `already_done`, `pending`, ...). */
export interface ActionResult {
  action: string;
  outcome: string;
  connector?: string;
}

/** verdict's answer to a signal: the same on every retry of its key. */
export interface Decision {
  event_id: string;
  subject_hash: string;
  decision: DecisionKind;
  playbook_version: number;
  rule: string;
  actions: ActionResult[];
}

/** A signal verdict accepted: its decision, and how it got there. */
export interface SignalOutcome {
  status: number;
  decision: Decision;
  /** Whether verdict answered from its stored response (`Idempotent-Replayed: true`). */
  replayed: boolean;
  /** The key every attempt carried. */
  idempotencyKey: string;
  /** Attempts made, the successful one included. */
  attempts: number;
}

/** A decision callback, as verdict sends it byte for byte the same on every attempt. */
export interface Envelope {
  event_id: string;
  tenant: string;
  event_type: string;
  subject_hash: string;
  timestamp: string;
  decision: string;
  actions: unknown;
  metadata: unknown;
  /** `signals`, `set` or `camara`; envelopes from before feeds existed lack it. */
  feed: string;
}

/** Serialised once per signal: every retry must carry these same bytes. */
export function signalBytes(signal: Signal): Buffer {
  const observedAt = signal.observed_at instanceof Date ? signal.observed_at.toISOString() : signal.observed_at;
  return Buffer.from(
    JSON.stringify({
      type: signal.type,
      subject: signal.subject,
      observed_at: observedAt,
      attributes: signal.attributes ?? {},
      metadata: signal.metadata ?? {},
    }),
    "utf8",
  );
}

const ENVELOPE_TEXT_FIELDS = ["event_id", "tenant", "event_type", "subject_hash", "timestamp", "decision"] as const;

/** Parses an envelope, refusing one that lacks a field verdict always sends. */
export function parseEnvelope(value: unknown): Envelope {
  if (typeof value !== "object" || value === null) {
    throw new TypeError("not a verdict envelope: not a JSON object");
  }
  const fields = value as Record<string, unknown>;
  const missing = ENVELOPE_TEXT_FIELDS.filter((name) => typeof fields[name] !== "string");
  if (missing.length > 0 || !("actions" in fields) || !("metadata" in fields)) {
    throw new TypeError(`not a verdict envelope: missing or mistyped ${missing.join(", ") || "actions/metadata"}`);
  }
  return { ...(fields as unknown as Envelope), feed: typeof fields.feed === "string" ? fields.feed : "signals" };
}

/** Reads a 2xx body as a decision, refusing one that lacks its fields. */
export function parseDecision(value: unknown): Decision {
  const fields = (typeof value === "object" && value !== null ? value : {}) as Record<string, unknown>;
  if (typeof fields.event_id !== "string" || typeof fields.decision !== "string" || !Array.isArray(fields.actions)) {
    throw new TypeError("verdict's answer is not a decision");
  }
  return fields as unknown as Decision;
}
