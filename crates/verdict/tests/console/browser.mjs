// Drives the verdict console in Debian's headless Chromium, as an operator would: sign in, open
// an event, redeliver a dead letter and see its new attempt, edit a playbook with an error and
// see it refused at its line, simulate and publish a change; then, as another tenant's admin,
// look up a locked account on the Subjects page and unlock it. Screenshots of the main pages are
// written to SHOTS and checked to be non-blank. Run by crates/verdict/tests/it/console.rs, which
// starts the server and seeds the history, and checks afterwards what the unlock did in the
// identity provider. Last, a sign-in form posted from another page is refused (login CSRF).
// Exits non-zero on the first failed expectation.
//
// Environment: BASE (http://127.0.0.1:PORT), API_KEY (an admin key), DEAD_EVENT (the id of an
// event whose delivery is dead), SHOTS (a directory), GOOD_PLAYBOOK (a file), SUBJECTS_API_KEY
// (an admin key of the tenant whose lock_account is bound to SCIM), SUBJECT_ACCOUNT (an account
// a SIM swap locked), LOCK_EVENT (that swap's event id), CHROMIUM.

import { chromium } from "playwright-core";
import { PNG } from "pngjs";
import fs from "node:fs";
import path from "node:path";

const { BASE, API_KEY, DEAD_EVENT, SHOTS, GOOD_PLAYBOOK, SUBJECTS_API_KEY, SUBJECT_ACCOUNT, LOCK_EVENT } = process.env;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

function expect(condition, what) {
  if (!condition) {
    throw new Error(`expected: ${what}`);
  }
  console.log(`ok: ${what}`);
}

/** A screenshot that must not be blank: many colours, not one flat page. */
async function shot(page, name) {
  const file = path.join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  const png = PNG.sync.read(fs.readFileSync(file));
  const colours = new Set();
  for (let i = 0; i < png.data.length && colours.size < 64; i += 4 * 97) {
    colours.add((png.data[i] << 16) | (png.data[i + 1] << 8) | png.data[i + 2]);
  }
  expect(png.width > 300 && png.height > 200 && colours.size >= 8, `${name}.png is not blank (${colours.size}+ colours)`);
}

fs.mkdirSync(SHOTS, { recursive: true });
const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const violations = [];
try {
  const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
  const page = await context.newPage();
  // Errors in the page: CSP violations, failed loads. The refused sign-in above answers 401 on
  // purpose; nothing else may fail.
  let expectRefusal = false;
  page.on("console", (msg) => {
    const text = msg.text();
    if (msg.type() === "error" && !(expectRefusal && text.includes("401"))) violations.push(text);
  });

  // Sign in.
  await page.goto(`${BASE}/console/`);
  expect(page.url().endsWith("/console/sign-in"), "an anonymous visitor is sent to sign in");
  await shot(page, "sign-in");
  expectRefusal = true;
  await page.fill("#api_key", "vk_not-a-key");
  await page.click("button[type=submit]");
  expect((await page.textContent("p.error")).includes("not valid"), "a wrong key is refused");
  expectRefusal = false;
  await page.fill("#api_key", API_KEY);
  await page.click("button[type=submit]");
  expect(page.url().endsWith("/console/events"), "signing in lands on the events");
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === "verdict_console");
  expect(session && session.httpOnly && session.sameSite === "Strict", "the session cookie is HttpOnly and SameSite=Strict");
  const rows = await page.locator("table.events tbody tr").count();
  expect(rows >= 2, `the events list shows the history (${rows} rows)`);
  await shot(page, "events");

  // Filter: only denials.
  await page.selectOption("select[name=decision]", "deny");
  await page.click("form.filters button");
  const badges = await page.locator("table.events tbody .badge").allTextContents();
  expect(badges.length > 0 && badges.every((b) => b === "deny"), "the decision filter keeps only denials");

  // Open the event whose callback is a dead letter, and redeliver it.
  await page.goto(`${BASE}/console/events/${DEAD_EVENT}`);
  expect((await page.textContent("h1")) === "Event", "an event opens");
  const body = await page.textContent("main");
  expect(!/\+1555/.test(body), "the event shows no raw phone number");
  expect(body.includes("recent_sim_swap") && body.includes("lock_account"), "the event shows its rule and actions");
  const before = await page.locator("table.attempts tbody tr").count();
  expect((await page.locator("section.delivery .badge.dead").count()) === 1, "its delivery is dead");
  await shot(page, "event");
  await page.click("section.delivery form button");
  expect((await page.textContent("p.notice")).includes("Redelivered"), "redelivery reports its attempt");
  const after = await page.locator("table.attempts tbody tr").count();
  expect(after === before + 1, `the new attempt is listed (${before} → ${after})`);
  const last = await page.locator("table.attempts tbody tr").last().textContent();
  expect(last.includes("redeliver") && last.includes("204"), "the new attempt was a redelivery answered 204");

  // The deliveries page.
  await page.goto(`${BASE}/console/deliveries`);
  expect((await page.locator("table.deliveries tbody tr").count()) >= 1, "deliveries are listed");
  await shot(page, "deliveries");

  // A playbook with an error is refused at its line.
  await page.goto(`${BASE}/console/playbook`);
  expect((await page.textContent("main")).includes("version 0"), "the built-in default is in force");
  await page.fill("#source", '[[rule]]\nname = "broken"\ndecision = "maybe"\n');
  await page.click("form.editor button");
  expect((await page.textContent("strong.line")) === "3", "the error names line 3");
  expect((await page.textContent("li.marked")).includes('decision = "maybe"'), "line 3 is marked");
  await shot(page, "playbook-error");

  // A valid change: simulated against the history, then published.
  await page.fill("#source", fs.readFileSync(GOOD_PLAYBOOK, "utf8"));
  await page.click("form.editor button");
  const simulation = await page.textContent("section.simulation");
  expect(/1\s+of\s+\d+\s+recent events/.test(simulation), `the simulation counts one change (${simulation.trim().replace(/\s+/g, " ")})`);
  expect(simulation.includes("subject_already_locked"), "the change is from the locked-subject rule");
  await shot(page, "simulation");
  await page.click("form.publish button");
  expect((await page.textContent("p.notice")).includes("Version 1 is now in force"), "publishing makes version 1");
  expect((await page.locator("table.history tbody tr").count()) === 1, "the history lists it");

  // Live numbers.
  await page.goto(`${BASE}/console/live`);
  expect((await page.locator("svg.chart rect").count()) === 60, "sixty minutes of signals are drawn");
  await shot(page, "live");

  // A form posted without the session's CSRF token is refused.
  const forged = await page.request.post(`${BASE}/console/playbook/publish`, {
    form: { csrf: "0".repeat(64), source: "[[rule]]\nname = \"x\"\ndecision = \"allow\"\n", format: "toml" },
  });
  expect(forged.status() === 403, "a forged publish is refused (403)");

  // Subjects, as the other tenant's admin: find the locked account and unlock it.
  await page.click("form.sign-out button");
  expect(page.url().endsWith("/console/sign-in"), "signing out returns to sign-in");
  await page.fill("#api_key", SUBJECTS_API_KEY);
  await page.click("button[type=submit]");
  await page.click('header nav a[href="/console/subjects"]');
  expect((await page.textContent("h1")) === "Subjects", "the Subjects page opens from the navigation");
  await page.selectOption("select[name=kind]", "account");
  await page.fill("#identifier", SUBJECT_ACCOUNT);
  await page.click("form.lookup button");
  expect(page.url().endsWith("/console/subjects/lookup"), "the account is posted, not put in the URL");
  const lock = (await page.textContent("dd.lock")).trim();
  expect(lock.startsWith("locked since"), `the account is locked (${lock})`);
  expect((await page.locator(`dd.lock a[href="/console/events/${LOCK_EVENT}"]`).count()) === 1, "the lock links to the SIM swap that caused it");
  expect((await page.locator("form.way-back button").count()) === 3, "an admin key gets the three ways back");
  await shot(page, "subjects");
  await page.fill("#reason-unlock", "customer verified in branch");
  await page.click("form#unlock button");
  expect((await page.textContent("section.outcome code.outcome")) === "done", "the unlock's outcome is done");
  expect((await page.textContent("section.outcome")).includes("idp"), "it went through the SCIM connector");
  expect((await page.textContent("dd.lock")).trim() === "not locked", "the lock is gone");
  expect(!(await page.content()).includes("/console/subjects/lookup?"), "no identifier in any link");
  await shot(page, "subject-unlocked");
  await page.click("section.outcome a");
  const recorded = await page.textContent("main");
  expect(recorded.includes("operator.unlock_account") && recorded.includes("customer verified in branch"), "the unlock is recorded as an event with its reason");
  expect(!recorded.includes(SUBJECT_ACCOUNT), "the recorded event shows no raw account");

  // Login CSRF: a page elsewhere posts the sign-in form with a key of its choosing; the
  // browser is refused and holds no session.
  const elsewhere = await browser.newContext();
  const attacker = await elsewhere.newPage();
  await attacker.setContent(
    `<form method="post" action="${BASE}/console/sign-in"><input name="api_key" value="${API_KEY}"><button>go</button></form>`,
  );
  const [posted] = await Promise.all([attacker.waitForNavigation(), attacker.click("button")]);
  expect(posted && posted.status() === 403, `a sign-in posted from another site is refused (${posted && posted.status()})`);
  expect((await elsewhere.cookies()).every((c) => c.name !== "verdict_console"), "a cross-site sign-in sets no session cookie");
  await elsewhere.close();

  expect(violations.length === 0, `no console errors or CSP violations (${violations.join("; ")})`);
  console.log("console browser test passed");
} finally {
  await browser.close();
}
