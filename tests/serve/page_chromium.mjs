// The page at "/" in headless Chromium (Debian's /usr/bin/chromium, driven
// by playwright-core@1.65.1): it loads, a prompt streams an answer into the
// chat box, and a screenshot is written. Without --allow-fault-injection the
// page has no fault button; with it, the crash button of node 1 crashes that
// node's shard, the fault list shows it recovered, and a second prompt with
// the same seed streams the same text.
// Usage: node page_chromium.mjs CELLSHARD MODELS_DIR OUT_DIR
import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import assert from "node:assert/strict";
import { createInterface } from "node:readline";
import { mkdtempSync, existsSync, statSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [bin, models, outDir] = process.argv.slice(2);
const exe = process.env.CHROMIUM || "/usr/bin/chromium";
if (!existsSync(exe)) {
  if (process.env.CI) { console.log(`FAIL (CI is set): ${exe} is missing`); process.exit(1); }
  console.log(`SKIP: ${exe} is missing (apt-get install chromium)`); process.exit(77);
}

function startServe(args) {
  const p = spawn(bin, ["serve", "-m", `${models}/stories260K.bin`, "-z", `${models}/tok512.bin`,
                        "--listen", "127.0.0.1:0", ...args], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { p.kill("SIGKILL"); reject(new Error("serve did not say 'listening' in 60 s")); }, 60000);
    createInterface({ input: p.stdout }).once("line", (line) => {
      clearTimeout(timer);
      const m = /^listening (.*):(\d+)$/.exec(line);
      if (!m) { p.kill("SIGKILL"); reject(new Error("unexpected first line: " + line)); return; }
      resolve({ proc: p, port: Number(m[2]) });
    });
  });
}

// A fresh profile folder (playwright passes it as --user-data-dir), removed at the end.
const profile = mkdtempSync(join(tmpdir(), "cellshard-chromium-"));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: exe, headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"] });
const servers = [];
// The answer is complete (the page re-enables Send); on a timeout, say what the page shows.
async function finished(page) {
  try {
    await page.waitForFunction(() => document.getElementById("output").dataset.done === "1", null, { timeout: 90000 });
  } catch (e) {
    throw new Error("the answer did not complete: output " + JSON.stringify(await page.textContent("#output")) +
                    ", " + (await page.textContent("#streaminfo")));
  }
}
try {
  async function chat(page) {
    await page.fill("#prompt", "Tell me a story.");
    await page.fill("#max_tokens", "60");
    await page.fill("#seed", "11");
    await page.evaluate(() => { delete document.getElementById("output").dataset.done; });
    await page.click("#send");
    await finished(page);
    return page.textContent("#output");
  }

  // Without the flag: the page streams, and there is no fault button.
  const plain = await startServe(["--nodes", "3"]);
  servers.push(plain.proc);
  const page = await browser.newPage();
  await page.goto(`http://127.0.0.1:${plain.port}/`);
  await page.waitForFunction(() => document.querySelectorAll("#nodes tr").length >= 3, null, { timeout: 20000 });
  // Streamed: every text the answer box showed on its way to the final one,
  // recorded by a MutationObserver (each token event appends to the box): the
  // answer must appear token by token, each a longer prefix of the final text,
  // not in one piece at the end.
  await page.evaluate(() => {
    window.shown = [];
    new MutationObserver((records) => {
      for (const r of records) for (const n of r.addedNodes) window.shown.push(n.textContent);
    }).observe(document.getElementById("output"), { childList: true, characterData: true, subtree: true });
  });
  await page.fill("#prompt", "Once upon a time");
  await page.fill("#max_tokens", "200");
  await page.click("#send");
  await finished(page);
  const first = await page.textContent("#output");
  assert.ok(first.length > 20, "no streamed text: " + JSON.stringify(first));
  const shown = (await page.evaluate(() => window.shown)).filter((t) => t.length > 0);
  assert.ok(shown.length >= 20, "the answer appeared in " + shown.length + " pieces, not token by token");
  for (let i = 0; i < shown.length; i++) {
    assert.ok(first.startsWith(shown[i]), "a shown text is not a prefix of the answer: " + JSON.stringify(shown[i]));
    if (i > 0) assert.ok(shown[i].length > shown[i - 1].length, "the shown text did not grow at step " + i);
  }
  assert.equal(shown[shown.length - 1], first);
  console.log("streamed", first.length, "characters, shown in", shown.length, "growing pieces");
  assert.equal(await page.locator("button.fault-crash").count(), 0, "a fault button without --allow-fault-injection");
  const shot = join(outDir, "serve-page.png");
  await page.screenshot({ path: shot, fullPage: true });
  assert.ok(statSync(shot).size > 1000, "screenshot too small");
  console.log("screenshot:", shot);

  // With the flag: buttons per node holding a shard; crash node 1, watch it recover.
  const faulty = await startServe(["--nodes", "3", "--spares", "1", "--allow-fault-injection"]);
  servers.push(faulty.proc);
  const page2 = await browser.newPage();
  await page2.goto(`http://127.0.0.1:${faulty.port}/`);
  await page2.waitForSelector("button.fault-crash[data-node='1']", { timeout: 20000 });
  assert.equal(await page2.locator("button.fault-crash").count(), 3);
  const before = await chat(page2);
  await page2.click("button.fault-crash[data-node='1']");
  const after = await chat(page2);  // the crash fires on the next step: during this answer
  await page2.waitForFunction(() => /recovered/.test(document.getElementById("faults").textContent), null,
                              { timeout: 30000 });
  const faults = await page2.textContent("#faults");
  console.log("fault list:", faults);
  assert.match(faults, /crash of shard 1 on node 1/);
  assert.equal(after, before, "the answer after the crash differs from the one before (same seed)");
  await page2.screenshot({ path: join(outDir, "serve-page-fault.png"), fullPage: true });
  console.log("ok: page streams, fault button absent without the flag, crash recovered with it");
} finally {
  await browser.close();
  for (const p of servers) p.kill("SIGKILL");
  rmSync(profile, { recursive: true, force: true });
}
