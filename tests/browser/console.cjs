// Drives the operator console in headless Chromium (playwright-core) for tests/it/console.rs:
// log in (a wrong token first), read the counts, pause a consumer and a destination and resume
// them, open a dead letter whose payload holds markup,
// read its error history, replay it with a reason, ignore a consumer's dead letters by filter,
// find both in the audit trail, replay the largest group of the dead letters left, look at the
// page on a phone's screen.
// Prints one JSON object with what it saw; the Rust test asserts on it and on the database.
//
// Environment: PLAYWRIGHT_CORE (the playwright-core package directory), CHROMIUM (executable),
// CONSOLE_URL, CONSOLE_TOKEN, TARGET_ID (the dead letter to replay), BULK_ID (a dead letter of
// the consumer `billing`, ignored by filter), LONG_ID (a dead letter whose error is 100 KB),
// PAUSE_CONSUMER (a consumer to pause and resume), PAUSE_DESTINATION (a destination to pause and
// resume), SCREENSHOTS (a directory).
"use strict";

const path = require("path");
const fs = require("fs");
const { chromium } = require(process.env.PLAYWRIGHT_CORE);

const TIMEOUT = 15000;

async function main() {
  const shots = process.env.SCREENSHOTS;
  fs.mkdirSync(shots, { recursive: true });
  const profile = fs.mkdtempSync(path.join(require("os").tmpdir(), "outbox-console-chromium-"));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM,
    headless: true,
    args: [
      "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync",
    ],
    viewport: { width: 1280, height: 900 },
  });
  const seen = { errors: [], dialogs: 0 };
  try {
    const page = browser.pages()[0] || (await browser.newPage());
    page.setDefaultTimeout(TIMEOUT);
    page.on("pageerror", (e) => seen.errors.push(String(e)));
    page.on("console", (m) => { if (m.type() === "error") seen.errors.push(m.text()); });
    page.on("dialog", (d) => { seen.dialogs += 1; d.dismiss().catch(() => {}); });
    const byId = (id) => page.getByTestId(id);

    await page.goto(process.env.CONSOLE_URL);
    await byId("login").waitFor();

    // A wrong token is refused and says so.
    await byId("token").fill("not-the-token-0123456789");
    await byId("login-submit").click();
    await page.waitForFunction(() => document.getElementById("message").textContent.includes("refused"));
    seen.wrongTokenMessage = await byId("message").textContent();
    // The 401 is an expected console error of the browser; keep only the page's own errors.
    seen.errors = seen.errors.filter((e) => !e.includes("401"));

    await byId("token").fill(process.env.CONSOLE_TOKEN);
    await byId("login-submit").click();
    await byId("overview").waitFor();
    await page.waitForFunction(() => document.getElementById("c-backlog").textContent !== "");
    seen.backlog = await byId("outbox-backlog").textContent();
    seen.deadTotal = await byId("dead-total").textContent();
    seen.scheduled = await byId("scheduled").textContent();
    seen.nextDue = await byId("next-due").textContent();
    seen.outboxCounts = await page.$$eval("#outbox-counts tbody tr", (rows) =>
      Object.fromEntries(rows.map((r) => [r.cells[0].textContent, r.cells[1].textContent])));
    seen.consumers = await page.$$eval("#consumers tbody tr", (rows) =>
      rows.map((r) => ({ consumer: r.cells[0].textContent, dead: r.cells[3].textContent })));
    seen.storage = await page.$$eval("#storage tbody tr", (rows) =>
      rows.map((r) => Array.from(r.cells).map((c) => c.textContent)));
    await page.screenshot({ path: path.join(shots, "overview.png"), fullPage: true });

    // Pause a consumer from its row, with a reason; a destination from the form, without one.
    const consumer = process.env.PAUSE_CONSUMER;
    const destination = process.env.PAUSE_DESTINATION;
    const pausesApi = () => page.evaluate(async (token) => {
      const response = await fetch("api/pauses", { headers: { Authorization: "Bearer " + token } });
      return response.json();
    }, process.env.CONSOLE_TOKEN);
    const consumerRow = page.locator(`#consumers tbody tr[data-consumer="${consumer}"]`);
    const consumerState = async () => ({
      paused: await consumerRow.getAttribute("data-paused"),
      state: await consumerRow.getByTestId("consumer-state").textContent(),
      button: await consumerRow.getByTestId("consumer-pause").textContent(),
    });
    const pauseRows = () => page.$$eval("#pauses tbody tr", (rows) => rows.map((r) =>
      r.dataset.pause
        ? { pause: r.dataset.pause, kind: r.cells[0].textContent, name: r.cells[1].textContent, since: r.cells[2].textContent, by: r.cells[3].textContent, reason: r.cells[4].textContent }
        : { empty: r.textContent }));
    seen.consumerBeforePause = await consumerState();
    seen.pausesBefore = await pauseRows();
    await consumerRow.getByTestId("consumer-pause").click();
    await byId("reason-dialog").waitFor();
    seen.pauseQuestion = await page.locator("#reason-title").textContent();
    seen.pauseReasonLabel = await page.locator("#reason-label").textContent();
    await byId("reason").fill("stock v2 deploy");
    await byId("reason-ok").click();
    await page.locator(`#consumers tbody tr[data-consumer="${consumer}"][data-paused="true"]`).waitFor();
    seen.afterPause = await byId("message").textContent();
    seen.consumerWhilePaused = await consumerState();
    await byId("pause-destination-name").fill(destination);
    await byId("pause-destination-submit").click();
    await byId("reason-dialog").waitFor();
    seen.pauseDestinationQuestion = await page.locator("#reason-title").textContent();
    await byId("reason-ok").click();
    await page.locator(`#pauses tbody tr[data-pause="destination ${destination}"]`).waitFor();
    seen.afterPauseDestination = await byId("message").textContent();
    seen.destinationFieldAfter = await byId("pause-destination-name").inputValue();
    seen.pausesListed = await pauseRows();
    seen.pausesFromApi = await pausesApi();
    await byId("consumers-and-pauses").screenshot({ path: path.join(shots, "pauses.png") });

    // Resume the destination from the list of pauses, the consumer from its row.
    await page.locator(`#pauses tbody tr[data-pause="destination ${destination}"]`).getByTestId("pause-resume").click();
    await byId("reason-dialog").waitFor();
    seen.resumeDestinationQuestion = await page.locator("#reason-title").textContent();
    await byId("reason").fill("broker back");
    await byId("reason-ok").click();
    await page.locator(`#pauses tbody tr[data-pause="destination ${destination}"]`).waitFor({ state: "detached" });
    await consumerRow.getByTestId("consumer-pause").click();
    await byId("reason-dialog").waitFor();
    seen.resumeQuestion = await page.locator("#reason-title").textContent();
    await byId("reason").fill("deployed");
    await byId("reason-ok").click();
    await page.locator(`#consumers tbody tr[data-consumer="${consumer}"][data-paused="false"]`).waitFor();
    seen.afterResume = await byId("message").textContent();
    seen.consumerAfterResume = await consumerState();
    seen.pausesAfter = await pauseRows();
    seen.pausesFromApiAfter = await pausesApi();

    // The dead letter with markup in its payload and error.
    const target = process.env.TARGET_ID;
    await byId("nav-dead").click();
    const row = page.locator(`#dead-list tbody tr[data-id="${target}"]`);
    await row.waitFor();
    seen.listedError = await row.locator("td").nth(5).textContent();
    seen.listed = await page.$$eval("#dead-list tbody tr", (rows) => rows.map((r) => r.dataset.id));

    // A 100 KB error: one line in the list, whole (in a scrolling box) in the detail.
    const longId = process.env.LONG_ID;
    const longRow = page.locator(`#dead-list tbody tr[data-id="${longId}"]`);
    await longRow.waitFor();
    seen.rowHeights = await page.$$eval("#dead-list tbody tr", (rows) =>
      rows.map((r) => ({ id: r.dataset.id, height: r.getBoundingClientRect().height })));
    seen.longListed = await longRow.locator("td").nth(5).textContent();
    await longRow.click();
    await page.waitForFunction((id) => document.getElementById("detail-title").textContent.startsWith(id + " "), longId);
    seen.longDetailChars = (await byId("last-error").textContent()).length;
    seen.longDetailBoxHeight = await byId("last-error").evaluate((e) => e.getBoundingClientRect().height);
    seen.longFailureBoxHeight = await page.$eval("#failures tbody td .long", (e) => e.getBoundingClientRect().height);

    await row.click();
    await byId("detail").waitFor();
    await page.waitForFunction((id) => document.getElementById("detail-title").textContent.startsWith(id + " "), target);
    seen.payload = await byId("payload").textContent();
    seen.elementsInPayload = await page.$$eval("#detail-payload *", (nodes) => nodes.length);
    seen.scriptsInPage = await page.$$eval("script", (nodes) => nodes.length);
    seen.imagesInPage = await page.$$eval("img", (nodes) => nodes.length);
    seen.pwned = await page.evaluate(() => window.__pwned === true);
    seen.failures = await page.$$eval("#failures tbody tr", (rows) =>
      rows.map((r) => ({ attempt: r.cells[1].textContent, status: r.cells[2].textContent, error: r.cells[3].textContent })));
    // Markup in the error is text: the cell holds the page's own box and nothing else.
    seen.elementsInFailures = await page.$$eval("#failures td *", (nodes) => nodes.filter((n) => !n.matches("div.long")).length);
    await page.screenshot({ path: path.join(shots, "dead-letter.png"), fullPage: true });

    // Replay it with a reason.
    await byId("replay").click();
    await byId("reason-dialog").waitFor();
    await byId("reason").fill("stock service fixed");
    await byId("reason-ok").click();
    await row.waitFor({ state: "detached" });
    seen.afterReplay = await byId("message").textContent();
    seen.listedAfter = await page.$$eval("#dead-list tbody tr", (rows) => rows.map((r) => r.dataset.id || ""));

    // Every dead inbox message of one consumer, ignored at once through the filter.
    await page.locator("#filters input[name=consumer]").fill("billing");
    await page.locator("#filters button[type=submit]").click();
    const bulkTarget = page.locator(`#dead-list tbody tr[data-id="${process.env.BULK_ID}"]`);
    // The row was listed before the filter too: wait for the filtered list itself.
    await page.waitForFunction((id) => {
      const rows = [...document.querySelectorAll("#dead-list tbody tr")];
      return rows.length === 1 && rows[0].dataset.id === id;
    }, process.env.BULK_ID);
    seen.listedFiltered = await page.$$eval("#dead-list tbody tr", (rows) => rows.map((r) => r.dataset.id || ""));
    await byId("ignore-matching").click();
    await byId("reason-dialog").waitFor();
    seen.bulkQuestion = await page.locator("#reason-title").textContent();
    await byId("reason").fill("billing retired");
    await byId("reason-ok").click();
    await bulkTarget.waitFor({ state: "detached" });
    seen.afterBulk = await byId("message").textContent();

    // The audit trail.
    await byId("nav-audit").click();
    await page.locator("#audit-list tbody tr[data-action]").first().waitFor();
    seen.audit = await page.$$eval("#audit-list tbody tr[data-action]", (rows) =>
      rows.map((r) => ({ action: r.cells[1].textContent, target: r.cells[2].textContent, actor: r.cells[4].textContent, reason: r.cells[5].textContent })));
    await page.screenshot({ path: path.join(shots, "audit.png"), fullPage: true });

    // The dead letters left, grouped by error; the largest group replayed at once.
    await byId("nav-groups").click();
    await page.locator("#group-list tbody tr[data-group]").first().waitFor();
    seen.groups = await page.$$eval("#group-list tbody tr[data-group]", (rows) =>
      rows.map((r) => ({ group: r.dataset.group, count: r.cells[1].textContent, source: r.cells[2].textContent, error: r.cells[3].textContent })));
    await page.screenshot({ path: path.join(shots, "groups.png"), fullPage: true });
    const first = page.locator("#group-list tbody tr[data-group]").first();
    const firstGroup = await first.getAttribute("data-group");
    await first.getByTestId("group-replay").click();
    await byId("reason-dialog").waitFor();
    seen.groupQuestion = await page.locator("#reason-title").textContent();
    await byId("reason").fill("cause fixed");
    await byId("reason-ok").click();
    await page.locator(`#group-list tbody tr[data-group="${firstGroup}"]`).waitFor({ state: "detached" });
    seen.afterGroup = await byId("message").textContent();
    seen.groupsAfter = await page.$$eval("#group-list tbody tr[data-group]", (rows) => rows.map((r) => r.dataset.group));

    // A phone's screen: nothing wider than the screen but the tables' own scroll boxes.
    await page.setViewportSize({ width: 390, height: 844 });
    await byId("nav-overview").click();
    await page.waitForFunction(() => document.getElementById("c-backlog").textContent !== "");
    seen.phoneOverflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    await page.screenshot({ path: path.join(shots, "phone.png"), fullPage: true });
  } finally {
    await browser.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  process.stdout.write(JSON.stringify(seen) + "\n");
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e) + "\n");
  process.exit(1);
});
