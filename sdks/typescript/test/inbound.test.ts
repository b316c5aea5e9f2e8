/**
 * Issue 27 item 1: signals signed by the npm `standardwebhooks` package, the reference library
 * of others, are taken by verdict once under their `webhook-id`; tampered, stale, re-keyed and
 * unsigned ones are refused; and the README's TypeScript example works as printed.
 * (The Python library's twin is crates/verdict/tests/it/signed_keys.rs.)
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Webhook } from "standardwebhooks";
import ts from "typescript";

import { REPO, Verdict } from "./helpers.js";

function simSwap(phone: string): string {
  return JSON.stringify({ type: "sim_swap", subject: { phone }, observed_at: new Date().toISOString() });
}

/** The README's example in `lang` under "From any language", as printed. */
function readmeExample(lang: string): string {
  const section = readFileSync(join(REPO, "README.md"), "utf8").split("### From any language")[1];
  assert.ok(section, "the README's Standard Webhooks section");
  const lines = section.split("\n");
  const start = lines.indexOf("```" + lang);
  assert.ok(start >= 0, `a ${lang} example in the README`);
  const end = lines.findIndex((line, i) => i > start && line.startsWith("```"));
  return lines.slice(start + 1, end).join("\n") + "\n";
}

describe("signals signed by the npm standardwebhooks package", () => {
  let verdict: Verdict;
  before(async () => {
    // Callbacks go nowhere here: these tests are about what verdict takes in.
    verdict = await Verdict.start("http://127.0.0.1:9/");
  });
  after(() => verdict.stop());

  async function post(id: string | undefined, timestamp: number, signature: string | undefined, body: string) {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${verdict.tenant.apiKey}`,
      "Content-Type": "application/json",
    };
    if (id !== undefined) headers["webhook-id"] = id;
    if (signature !== undefined) {
      headers["webhook-timestamp"] = String(timestamp);
      headers["webhook-signature"] = signature;
    }
    const response = await fetch(`${verdict.base}/v1/signals`, { method: "POST", headers, body });
    return { status: response.status, replayed: response.headers.get("idempotent-replayed") === "true", body: await response.json() };
  }

  function sign(id: string, timestamp: number, body: string): string {
    return new Webhook(verdict.tenant.signingSecret).sign(id, new Date(timestamp * 1000), body);
  }

  function assertRefused(reply: { status: number; body: any }, status: number, problem: string, what: string) {
    assert.equal(reply.status, status, `${what}: ${JSON.stringify(reply.body)}`);
    assert.equal(reply.body.type, `https://verdict.dev/problems/${problem}`, what);
  }

  test("are taken once under their id; tampered, stale, re-keyed and unsigned ones are refused", async () => {
    const before = await verdict.eventCount();
    const body = simSwap("+447700900811");
    const id = `msg_${randomUUID()}`;
    const ts = Math.floor(Date.now() / 1000);
    const signature = sign(id, ts, body);
    assert.match(signature, /^v1,/);

    const first = await post(id, ts, signature, body);
    assert.equal(first.status, 200, JSON.stringify(first.body));
    assert.equal(first.replayed, false);
    // `webhook-id` is the idempotency key: the same message again is the same decision.
    const again = await post(id, ts, signature, body);
    assert.equal(again.status, 200);
    assert.equal(again.replayed, true);
    assert.deepEqual(again.body, first.body);

    // The signature covers the id: the captured bytes under a new id are refused.
    assertRefused(await post("msg_new", ts, signature, body), 401, "invalid-signature", "a new webhook-id");
    const tampered = body.replace("+447700900811", "+447700900812");
    assertRefused(await post(id, ts, signature, tampered), 401, "invalid-signature", "tampered");
    const old = ts - 301;
    assertRefused(await post("msg_old", old, sign("msg_old", old, body), body), 401, "stale-timestamp", "stale");
    assertRefused(await post("msg_unsigned", ts, undefined, body), 401, "invalid-signature", "unsigned");
    assert.equal(await verdict.eventCount(), before + 1);
  });

  test("the README's TypeScript example sends a signal verdict takes", async () => {
    const before = await verdict.eventCount();
    const source = readmeExample("typescript").replace("http://127.0.0.1:8080", verdict.base);
    assert.match(source, /new Webhook\(/);
    // Compiled as printed (types stripped by tsc's own transpiler), run where node_modules is.
    const compiled = ts.transpileModule(source, {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
    }).outputText;
    const script = join(REPO, "sdks", "typescript", "build-test", "readme-example.mjs");
    writeFileSync(script, compiled);
    execFileSync(process.execPath, [script], {
      env: { ...process.env, VERDICT_SIGNING_SECRET: verdict.tenant.signingSecret, VERDICT_API_KEY: verdict.tenant.apiKey },
      stdio: ["ignore", "inherit", "inherit"],
    });
    assert.equal(await verdict.eventCount(), before + 1, "the example's signal was not taken");
  });
});
