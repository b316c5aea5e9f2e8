/** Test fixtures: the corpus, a real `verdict serve` on a free loopback port with SQLite in a
 * temp dir, and the SDK's receiver mounted in Express on 127.0.0.1. */

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import express from "express";

import { Receiver, type Delivery } from "../src/index.js";
import { expressHandler } from "../src/express.js";

/** The repository root: tests run from build-test/test/. */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

/** One corpus file, as every language's tests read it. */
export function corpus<T = any>(name: string): T {
  return JSON.parse(readFileSync(join(REPO, "sdks", "conformance", name), "utf8")) as T;
}

/** `VERDICT_BIN`, else the debug build; a missing binary fails the run, never skips it. */
export function verdictBinary(): string {
  const target = process.env.CARGO_TARGET_DIR ?? join(REPO, "target");
  const binary = process.env.VERDICT_BIN ?? join(target, "debug", "verdict");
  if (!existsSync(binary)) {
    throw new Error(`no verdict binary at ${binary}: run \`cargo build -p verdict\` (or set VERDICT_BIN)`);
  }
  return binary;
}

export interface Tenant {
  id: string;
  apiKey: string;
  signingSecret: string;
  webhookSecret: string;
}

/** A free port on 127.0.0.1, from the kernel. */
export async function freePort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((done) => probe.listen(0, "127.0.0.1", done));
  const { port } = probe.address() as AddressInfo;
  await new Promise<void>((done) => probe.close(() => done()));
  return port;
}

/** A running `verdict serve` and the one tenant it was started with. */
export class Verdict {
  private constructor(
    readonly base: string,
    readonly tenant: Tenant,
    private readonly process: ChildProcess,
    private readonly dir: string,
  ) {}

  static async start(callbackUrl: string): Promise<Verdict> {
    const binary = verdictBinary();
    const dir = mkdtempSync(join(tmpdir(), "verdict-sdk-ts-"));
    const env = {
      ...process.env,
      VERDICT_DATABASE_URL: `sqlite://${dir}/verdict.db`,
      // The receiver is on this machine; private destinations are refused by default.
      VERDICT_ALLOW_PRIVATE_DESTINATIONS: "1",
      VERDICT_LOG: "warn",
    };
    const created = JSON.parse(
      execFileSync(binary, ["tenant", "create", "--name", "sdk-test", "--callback-url", callbackUrl, "--json"], {
        env,
        encoding: "utf8",
      }),
    );
    const tenant: Tenant = {
      id: created.tenant_id,
      apiKey: created.api_key,
      signingSecret: created.signing_secret,
      webhookSecret: created.webhook_secret,
    };
    const port = await freePort();
    const child = spawn(binary, ["serve", "--listen", `127.0.0.1:${port}`], { env, stdio: "ignore" });
    const base = `http://127.0.0.1:${port}`;
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`verdict serve exited with ${child.exitCode}`);
      try {
        if ((await fetch(`${base}/readyz`)).status === 200) return new Verdict(base, tenant, child, dir);
      } catch {
        // Not listening yet.
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    child.kill();
    throw new Error("verdict serve did not become ready in 30 s");
  }

  async get(path: string): Promise<any> {
    const response = await fetch(`${this.base}${path}`, { headers: { Authorization: `Bearer ${this.tenant.apiKey}` } });
    if (!response.ok) throw new Error(`GET ${path}: ${response.status} ${await response.text()}`);
    return response.json();
  }

  post(path: string): Promise<Response> {
    return fetch(`${this.base}${path}`, { method: "POST", headers: { Authorization: `Bearer ${this.tenant.apiKey}` } });
  }

  /** The events verdict holds for this tenant. */
  async eventCount(): Promise<number> {
    return (await this.get("/v1/events?limit=100")).data.length;
  }

  async stop(): Promise<void> {
    const exited = new Promise((done) => this.process.once("exit", done));
    this.process.kill("SIGTERM");
    await exited;
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** What the test's handler saw: one entry per call. */
export class Handled {
  readonly deliveries: Delivery[] = [];
  readonly handle = (delivery: Delivery): void => {
    this.deliveries.push(delivery);
  };

  ofEvent(eventId: string): Delivery[] {
    return this.deliveries.filter((d) => d.envelope.event_id === eventId);
  }

  async waitFor(eventId: string, timeoutMs = 10_000): Promise<Delivery[]> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const found = this.ofEvent(eventId);
      if (found.length > 0) return found;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`no callback for event ${eventId} within ${timeoutMs} ms`);
  }
}

/** verdict calling back the SDK's receiver in Express, with the handler's record. */
export interface Stack {
  verdict: Verdict;
  receiverUrl: string;
  handled: Handled;
  stop(): Promise<void>;
}

export async function startStack(): Promise<Stack> {
  const app = express();
  const server: Server = await new Promise((done) => {
    const listening = app.listen(0, "127.0.0.1", () => done(listening));
  });
  const receiverUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/verdict`;
  // The tenant (and its webhook secret) exists before the receiver that checks it.
  const verdict = await Verdict.start(receiverUrl);
  const handled = new Handled();
  app.post("/verdict", ...expressHandler(new Receiver(verdict.tenant.webhookSecret), handled.handle));
  return {
    verdict,
    receiverUrl,
    handled,
    async stop() {
      await verdict.stop();
      server.closeAllConnections();
      await new Promise((done) => server.close(done));
    },
  };
}
