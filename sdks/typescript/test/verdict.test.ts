/** The SDK against the real `verdict` binary: signals sent with the Sender, callbacks received
 * by the Receiver in Express, over real HTTP on 127.0.0.1. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Webhook } from "standardwebhooks";

import { KeyReusedError, Sender, signalBytes, type Signal } from "../src/index.js";
import { corpus, startStack, type Stack } from "./helpers.js";

const CONFLICTS = corpus("conflicts.json").cases;

function signal(phone: string): Signal {
  return { type: "sim_swap", subject: { phone }, observed_at: new Date(), metadata: { ticket: `T-${phone.slice(-3)}` } };
}

function signed(secret: string, msgId: string, timestamp: number, body: string): Record<string, string> {
  const signature = new Webhook(secret).sign(msgId, new Date(timestamp * 1000), body);
  return {
    "webhook-id": msgId,
    "webhook-timestamp": String(timestamp),
    "webhook-signature": signature,
    "content-type": "application/json",
  };
}

describe("the SDK against a real verdict", () => {
  let stack: Stack;
  let sender: Sender;
  before(async () => {
    stack = await startStack();
    const { apiKey, signingSecret } = stack.verdict.tenant;
    sender = new Sender(stack.verdict.base, apiKey, { signingSecret, maxAttempts: 3 });
  });
  after(() => stack.stop());

  test("one decision per key, and a retry gets the same decision", async () => {
    const s = signal("+447700900401");
    const first = await sender.send(s);
    const again = await sender.resend(signalBytes(s), first.idempotencyKey);
    assert.equal(first.status, 200);
    assert.equal(first.replayed, false);
    assert.equal(again.replayed, true);
    assert.deepEqual(again.decision, first.decision);
    const events = (await stack.verdict.get("/v1/events?limit=100")).data;
    assert.equal(events.filter((e: any) => e.id === first.decision.event_id).length, 1);
  });

  test("the callback is received once, and a redelivery is answered without the handler", async () => {
    const outcome = await sender.send(signal("+447700900402"));
    const eventId = outcome.decision.event_id;
    const [delivery] = await stack.handled.waitFor(eventId);
    assert.equal(delivery!.envelope.decision, outcome.decision.decision);
    assert.equal(delivery!.envelope.subject_hash, outcome.decision.subject_hash);
    assert.deepEqual(delivery!.envelope.metadata, { ticket: "T-402" });

    // verdict sends it again, same webhook-id: the receiver answers 2xx and skips the handler.
    const page = await stack.verdict.get("/v1/deliveries?limit=500");
    const [record] = page.data.filter((d: any) => d.event_id === eventId && d.action === "callback");
    assert.equal(record.webhook_id, delivery!.webhookId);
    // The inline attempt's record lands after the response (within 25 ms): until then the
    // delivery is still leased to it, and a redelivery is refused.
    let status = record.status;
    for (const deadline = Date.now() + 10_000; Date.now() < deadline && status === "pending"; ) {
      await new Promise((r) => setTimeout(r, 20));
      status = (await stack.verdict.get(`/v1/deliveries/${record.id}`)).status;
    }
    assert.equal(status, "succeeded");
    assert.ok([200, 202].includes((await stack.verdict.post(`/v1/deliveries/${record.id}/redeliver`)).status));
    let attempts: any[] = [];
    for (const deadline = Date.now() + 10_000; Date.now() < deadline && attempts.length < 2; ) {
      attempts = (await stack.verdict.get(`/v1/deliveries/${record.id}`)).attempts;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.deepEqual(
      attempts.map((a) => a.status_code),
      [204, 204],
    );
    assert.equal(stack.handled.ofEvent(eventId).length, 1);
  });

  test("the receiver refuses tampered, stale and unsigned deliveries", async () => {
    const outcome = await sender.send(signal("+447700900403"));
    const [delivery] = await stack.handled.waitFor(outcome.decision.event_id);
    const secret = stack.verdict.tenant.webhookSecret;
    const body = delivery!.body.toString("utf8");
    const post = async (headers: Record<string, string>, content: string) =>
      (await fetch(stack.receiverUrl, { method: "POST", headers, body: content })).status;
    const now = Math.floor(Date.now() / 1000);
    const flipped = delivery!.envelope.decision === "allow" ? "deny" : "allow";
    const tampered = body.replace(`"decision":"${delivery!.envelope.decision}"`, `"decision":"${flipped}"`);
    assert.notEqual(tampered, body);
    assert.equal(await post(signed(secret, "msg_replayed", now, body), tampered), 401);
    assert.equal(await post(signed(secret, "msg_stale", now - 301, body), body), 401);
    assert.equal(await post({ "webhook-id": "msg_unsigned", "content-type": "application/json" }, body), 401);
    assert.equal(await post(signed("whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=", "msg_other", now, body), body), 401);
    // The genuine one, sent again by hand under its own id: a duplicate, answered 2xx.
    assert.equal(await post(signed(secret, delivery!.webhookId, now, body), body), 204);
    assert.equal(stack.handled.ofEvent(outcome.decision.event_id).length, 1);
  });

  for (const c of CONFLICTS) {
    test(`one key resent: ${c.name}`, async () => {
      const observedAt = new Date(Date.now() - 1000).toISOString().replace(/\.\d+Z$/, "Z");
      const [first, second] = [c.first, c.second].map((b: string) => Buffer.from(b.replaceAll("{observed_at}", observedAt)));
      const original = await sender.sendBytes(first!);
      if (c.expect.outcome === "replayed") {
        const replay = await sender.resend(second!, original.idempotencyKey);
        assert.equal(replay.replayed, true);
        assert.deepEqual(replay.decision, original.decision);
        return;
      }
      await assert.rejects(sender.resend(second!, original.idempotencyKey), (error: unknown) => {
        assert.ok(error instanceof KeyReusedError);
        assert.match(error.message, /key-generation bug/);
        assert.equal((error.problem as { type: string }).type, c.expect.problem_type);
        assert.equal(error.idempotencyKey, original.idempotencyKey);
        return true;
      });
    });
  }
});
