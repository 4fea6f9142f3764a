// Drives the console over a set of databases in headless Chromium (playwright-core) for
// tests/it/console_set.rs: log in, read the set's overview (each database's owner and figures,
// whether it is highlighted) and the selector, read the status of the first database, switch to
// the second with the selector and read its status and dead letters, switch back and read the
// first's dead letters.
// Prints one JSON object with what it saw; the Rust test asserts on it.
//
// Environment: PLAYWRIGHT_CORE (the playwright-core package directory), CHROMIUM (executable),
// CONSOLE_URL, CONSOLE_TOKEN, SCREENSHOTS (a directory).
"use strict";

const path = require("path");
const fs = require("fs");
const { chromium } = require(process.env.PLAYWRIGHT_CORE);

const TIMEOUT = 15000;

async function main() {
  const shots = process.env.SCREENSHOTS;
  fs.mkdirSync(shots, { recursive: true });
  const profile = fs.mkdtempSync(path.join(require("os").tmpdir(), "outbox-console-set-chromium-"));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM,
    headless: true,
    args: [
      "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync",
    ],
    viewport: { width: 1280, height: 900 },
  });
  const seen = { errors: [] };
  try {
    const page = browser.pages()[0] || (await browser.newPage());
    page.setDefaultTimeout(TIMEOUT);
    page.on("pageerror", (e) => seen.errors.push(String(e)));
    page.on("console", (m) => { if (m.type() === "error") seen.errors.push(m.text()); });
    // Every API request the page makes must succeed (the browser's own favicon request is
    // answered 401, as everything outside the page is without a token).
    seen.failedRequests = [];
    page.on("response", (r) => {
      if (r.status() >= 400 && r.url().includes("/api/")) seen.failedRequests.push(r.status() + " " + r.url());
    });
    const byId = (id) => page.getByTestId(id);
    const cards = async () => ({
      backlog: await byId("outbox-backlog").textContent(),
      dead: await byId("dead-total").textContent(),
    });
    // Select `name` and wait for the overview's cards to be filled from it.
    const switchTo = async (name) => {
      await page.evaluate(() => { document.getElementById("c-backlog").textContent = ""; });
      const status = page.waitForResponse((r) => r.url().includes("api/status?database=" + name));
      await page.selectOption("#database", name);
      await status;
      await page.waitForFunction(() => document.getElementById("c-backlog").textContent !== "");
    };

    await page.goto(process.env.CONSOLE_URL);
    await byId("login").waitFor();
    await byId("token").fill(process.env.CONSOLE_TOKEN);
    await byId("login-submit").click();
    await byId("overview").waitFor();
    await page.locator("#databases tbody tr[data-database]").nth(1).waitFor();
    await page.waitForFunction(() => document.getElementById("c-backlog").textContent !== "");
    seen.databases = await page.$$eval("#databases tbody tr[data-database]", (rows) => rows.map((r) => ({
      database: r.cells[0].textContent,
      owner: r.cells[1].textContent,
      pending: r.cells[2].textContent,
      oldest: r.cells[3].textContent,
      dead: r.cells[4].textContent,
      problem: r.cells[6].textContent,
      attention: r.dataset.attention,
      background: getComputedStyle(r).backgroundColor,
    })));
    seen.options = await page.$$eval("#database option", (options) =>
      options.map((o) => ({ value: o.value, text: o.textContent, attention: o.dataset.attention })));
    seen.selectedFirst = await page.$eval("#database", (s) => s.value);
    seen.acme = await cards();
    await page.screenshot({ path: path.join(shots, "set.png"), fullPage: true });

    await switchTo("globex");
    seen.globex = await cards();
    seen.selectedRow = await page.$eval("#databases tbody tr.selected", (r) => r.dataset.database);
    seen.showing = await byId("showing").textContent();

    // The dead letters view shows the database selected, and follows the selector.
    await byId("nav-dead").click();
    await page.locator("#dead-list tbody tr[data-id]").first().waitFor();
    seen.globexDead = await page.$$eval("#dead-list tbody tr", (rows) => rows.map((r) => r.dataset.id || r.textContent));
    await page.selectOption("#database", "acme");
    await page.waitForFunction(() => {
      const rows = [...document.querySelectorAll("#dead-list tbody tr")];
      return rows.length === 1 && !rows[0].dataset.id;
    });
    seen.acmeDead = await page.$$eval("#dead-list tbody tr", (rows) => rows.map((r) => r.dataset.id || r.textContent));
    await page.screenshot({ path: path.join(shots, "set-dead.png"), fullPage: true });
    seen.errors = seen.errors.filter((e) => !e.includes("status of 401"));
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
