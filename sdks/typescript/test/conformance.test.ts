/** The shared corpus (sdks/conformance) against the TypeScript SDK: signatures, envelopes, retries. */

import assert from "node:assert/strict";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import { Webhook } from "standardwebhooks";

import {
  Backoff,
  ConfigError,
  KeyReusedError,
  MemoryDedupStore,
  NetworkError,
  parseEnvelope,
  Receiver,
  RejectedError,
  Sender,
  standardWebhooksHeaders,
  UnavailableError,
  type Delivery,
} from "../src/index.js";
import { corpus, freePort } from "./helpers.js";

const SIGNATURES = corpus("signatures.json").cases;
const ENVELOPES = corpus("envelopes.json").cases;
const RETRIES = corpus("retries.json");
const SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const DECISION = {
  event_id: "e-1",
  subject_hash: "ab",
  decision: "deny",
  playbook_version: 1,
  rule: "fresh_sim_swap",
  actions: [{ action: "lock_account", outcome: "done" }],
};
const ERRORS: Record<string, Function> = {
  key_reused: KeyReusedError,
  rejected: RejectedError,
  unavailable: UnavailableError,
};

function signedAt(secret: string, msgId: string, timestamp: number, body: string): Record<string, string> {
  const signature = new Webhook(secret).sign(msgId, new Date(timestamp * 1000), body);
  return { "webhook-id": msgId, "webhook-timestamp": String(timestamp), "webhook-signature": signature };
}

describe("signatures", () => {
  for (const c of SIGNATURES) {
    test(`the sender signs as the reference did: ${c.name}`, () => {
      const headers = standardWebhooksHeaders(c.secret, c.id, c.timestamp, Buffer.from(c.body, "utf8"));
      assert.deepEqual(headers, {
        "webhook-id": c.id,
        "webhook-timestamp": String(c.timestamp),
        "webhook-signature": c.expected,
      });
    });
  }
});

describe("envelopes", () => {
  for (const c of ENVELOPES) {
    test(`verdict's callback verifies, parses, and is refused when stale: ${c.name}`, async () => {
      const { headers, body, webhook_secret: secret } = c;
      // verdict's signature is the one the npm reference library makes over the same bytes.
      const reference = new Webhook(secret).sign(
        headers["webhook-id"],
        new Date(Number(headers["webhook-timestamp"]) * 1000),
        body,
      );
      assert.ok(headers["webhook-signature"].split(" ").includes(reference));
      const receiver = new Receiver(secret);
      const handled: Delivery[] = [];
      const now = Math.floor(Date.now() / 1000);
      const bytes = Buffer.from(body, "utf8");
      const fresh = signedAt(secret, headers["webhook-id"], now, body);
      assert.equal((await receiver.receive(fresh, bytes, (d) => void handled.push(d))).status, 204);
      assert.deepEqual(
        handled.map((d) => d.envelope),
        [parseEnvelope(c.envelope)],
      );
      const stale = signedAt(secret, "msg_stale", now - 301, body);
      assert.equal((await receiver.receive(stale, bytes, (d) => void handled.push(d))).status, 401);
      assert.equal(handled.length, 1);
    });
  }
});

/** The stub's answers, in order (the last repeats), and every request it got. */
interface Script {
  answers: Array<[number, string | null]>;
  requests: Array<{ headers: IncomingHttpHeaders; body: Buffer }>;
}

describe("retries", () => {
  let server: Server;
  let base: string;
  let script: Script = { answers: [], requests: [] };
  const body = Buffer.from('{"type":"sim_swap","subject":{"phone":"+447700900123"},"observed_at":"2026-05-28T12:00:00Z"}');

  before(async () => {
    // A scripted stand-in for verdict on 127.0.0.1: real HTTP, answers from the corpus.
    server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (chunk: Buffer) => chunks.push(chunk));
      req.on("end", () => {
        script.requests.push({ headers: req.headers, body: Buffer.concat(chunks) });
        const [status, retryAfter] = script.answers[Math.min(script.requests.length, script.answers.length) - 1]!;
        const payload = JSON.stringify(status < 300 ? DECISION : { type: "about:blank", title: `status ${status}` });
        if (retryAfter !== null) res.setHeader("Retry-After", retryAfter);
        res.writeHead(status, { "Content-Type": "application/json" }).end(payload);
      });
    });
    await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => new Promise<void>((done) => server.close(() => done())));

  function sender(url: string, waits: number[], maxAttempts = 8): Sender {
    const { base_seconds, max_seconds } = RETRIES.backoff;
    return new Sender(url, "vk_test", {
      signingSecret: SECRET,
      maxAttempts,
      backoff: new Backoff(base_seconds, max_seconds),
      sleep: async (seconds) => void waits.push(seconds),
    });
  }

  async function run(s: Sender, expect: any): Promise<void> {
    if (expect.outcome === "accepted") {
      const outcome = await s.sendBytes(body);
      assert.equal(outcome.attempts, expect.attempts);
      assert.equal(outcome.decision.decision, "deny");
    } else {
      await assert.rejects(s.sendBytes(body), (error: Error) => {
        assert.ok(error instanceof ERRORS[expect.error]!, `${error.name}: ${error.message}`);
        if (expect.error === "key_reused") assert.match(error.message, /key-generation bug/);
        return true;
      });
    }
    assert.equal(script.requests.length, expect.attempts);
    const keys = new Set(script.requests.map((r) => r.headers["webhook-id"]));
    assert.equal(keys.size, 1, "the key changed between attempts");
    for (const request of script.requests) {
      assert.deepEqual(request.body, body);
      assert.equal(request.headers["idempotency-key"], request.headers["webhook-id"]);
      new Webhook(SECRET).verify(request.body, request.headers as Record<string, string>);
    }
  }

  for (const c of RETRIES.cases) {
    test(`status: ${c.name}`, async () => {
      script = { answers: [[c.status, c.retry_after], [200, null]], requests: [] };
      const waits: number[] = [];
      await run(sender(base, waits), c.expect);
      if (c.expect.wait === undefined) {
        assert.deepEqual(waits, []);
      } else {
        assert.equal(waits.length, 1);
        assert.ok(c.expect.wait.at_least <= waits[0]! && waits[0]! <= c.expect.wait.at_most, `waited ${waits}`);
      }
    });
  }

  for (const c of RETRIES.sequences) {
    test(`sequence: ${c.name}`, async () => {
      script = { answers: c.statuses.map((s: number) => [s, null]), requests: [] };
      const waits: number[] = [];
      await run(sender(base, waits, c.max_attempts), c.expect);
      assert.equal(waits.length, c.expect.waits_at_most.length);
      waits.forEach((w, i) => assert.ok(w >= 0 && w <= c.expect.waits_at_most[i], `waited ${waits}`));
    });
  }

  test("network errors back off boundedly, then carry the key for a resend", async () => {
    const waits: number[] = [];
    const s = sender(`http://127.0.0.1:${await freePort()}`, waits, 3);
    await assert.rejects(s.sendBytes(body), (error: unknown) => {
      assert.ok(error instanceof NetworkError);
      assert.equal(error.attempts, 3);
      assert.equal(error.idempotencyKey.length, 36);
      return true;
    });
    assert.equal(waits.length, 2);
    assert.ok(waits.every((w) => w >= 0 && w <= 1));
  });
});

describe("the dedupe store", () => {
  const c = ENVELOPES[0];
  const signed = (id: string) => signedAt(c.webhook_secret, id, Math.floor(Date.now() / 1000), c.body);
  const bytes = Buffer.from(c.body, "utf8");

  test("a failing handler answers 500, and verdict's retry is handled", async () => {
    const receiver = new Receiver(c.webhook_secret);
    const failing = () => {
      throw new Error("downstream is down");
    };
    assert.equal((await receiver.receive(signed("msg_f"), bytes, failing)).status, 500);
    const handled: Delivery[] = [];
    assert.equal((await receiver.receive(signed("msg_f"), bytes, (d) => void handled.push(d))).status, 204);
    assert.equal(handled.length, 1);
  });

  test("a delivery being handled asks its duplicate to retry until the lease ends", async () => {
    const store = new MemoryDedupStore();
    const now = Date.now() / 1000;
    await store.claim("msg_l", now, now + 300);
    const answer = await new Receiver(c.webhook_secret, { store }).receive(signed("msg_l"), bytes, () => {});
    assert.equal(answer.status, 503);
    assert.ok("Retry-After" in answer.headers);
    const later = new Receiver(c.webhook_secret, { store, clock: () => now + 301 });
    assert.equal((await later.receive(signed("msg_l"), bytes, () => {})).status, 204);
  });

  test("a signed body that is not an envelope is a 400", async () => {
    const receiver = new Receiver(c.webhook_secret);
    for (const body of ["[1, 2]", '{"event_id": "e"}', "not json"]) {
      const headers = signedAt(c.webhook_secret, "msg_n", Math.floor(Date.now() / 1000), body);
      assert.equal((await receiver.receive(headers, Buffer.from(body), () => {})).status, 400, body);
    }
  });

  test("an unusable signing secret is refused when the sender is built", () => {
    assert.throws(() => new Sender("http://127.0.0.1:9", "vk", { signingSecret: "whsec_" }), ConfigError);
  });

  test("a processed id is kept for the horizon, then pruned", async () => {
    const store = new MemoryDedupStore();
    await store.claim("msg_h", 1000, 1300);
    await store.markProcessed("msg_h", 1000);
    assert.equal(store.prune(1000 + 71 * 3600), 0);
    assert.equal(store.prune(1000 + 73 * 3600), 1);
    assert.throws(() => new MemoryDedupStore(600), /horizon/);
  });
});
