// Shared set-up of the end-to-end tests: a static server for dist/ on loopback and
// Debian's Chromium driven by playwright-core (no browser is ever downloaded).
import { createServer } from 'node:http';
import { readFile, stat } from 'node:fs/promises';
import { extname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const dist = fileURLToPath(new URL('../../dist/', import.meta.url));

const types = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript',
  '.wasm': 'application/wasm',
  '.css': 'text/css',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
};

/** Serves dist/ on 127.0.0.1 at a free port; unknown paths fall back to index.html. */
export async function serveDist() {
  // Large headers: the hostile-link tests open URLs with 100 KB values.
  const server = createServer({ maxHeaderSize: 1 << 20 }, async (req, res) => {
    const path = normalize(decodeURIComponent(new URL(req.url, 'http://x').pathname)).replace(/^(\.\.[/\\])+/, '');
    let file = join(dist, path);
    try {
      if ((await stat(file)).isDirectory()) file = join(file, 'index.html');
    } catch {
      file = join(dist, 'index.html');
    }
    try {
      const body = await readFile(file);
      res.writeHead(200, { 'content-type': types[extname(file)] ?? 'application/octet-stream' });
      res.end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return { origin: `http://127.0.0.1:${port}`, close: () => new Promise((r) => server.close(r)) };
}

export const launchArgs = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/** Debian's Chromium, headless. */
export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium',
    headless: true,
    args: launchArgs,
  });
}

/**
 * A fresh page that records uncaught errors, console errors and every request, and waits
 * for the app to render.
 */
export async function openPage(browser, url, { colorScheme = 'light', permissions = [], origin } = {}) {
  const context = await browser.newContext({ colorScheme });
  if (permissions.length) await context.grantPermissions(permissions, { origin });
  const page = await context.newPage();
  const errors = [];
  const requests = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text());
  });
  page.on('request', (r) => requests.push(r.url()));
  await page.goto(url);
  await page.getByTestId('total').waitFor();
  return { page, context, errors, requests };
}

/**
 * Waits until the address bar holds the inputs (it follows typing once it pauses); the
 * page's share link carries them at once.
 */
export async function urlSettled(page) {
  await page.waitForFunction(() => {
    const link = document.querySelector('[data-testid="share-link"]');
    return link && location.search === new URL(link.href).search;
  });
}

/** The exact byte count a figure carries. */
export async function bytesOf(page, testid) {
  const value = await page.getByTestId(testid).getAttribute('data-bytes');
  return value === null ? null : BigInt(value);
}

/** Waits until the figure `testid` carries bytes other than `before`, and returns them. */
export async function changedBytes(page, testid, before) {
  await page.waitForFunction(
    ([id, old]) => {
      const el = document.querySelector(`[data-testid="${id}"]`);
      return el && el.dataset.bytes !== undefined && el.dataset.bytes !== old;
    },
    [testid, String(before)],
  );
  return bytesOf(page, testid);
}

/**
 * Opens the folded section that holds the field, if it is closed, the way a person does:
 * a click on its summary.
 */
export async function reveal(page, testid) {
  const field = page.getByTestId(testid);
  await field.waitFor({ state: 'attached' });
  const fold = await field.evaluate((el) => {
    const details = el.closest('details');
    return details && !details.open ? details.dataset.testid : null;
  });
  if (fold) await page.getByTestId(`${fold}-summary`).click();
}

/** Chooses `value` in a drop-down, opening its folded section first. */
export async function choose(page, testid, value) {
  await reveal(page, testid);
  await page.getByTestId(testid).selectOption(value);
}

/** Replaces the text of a field the way a person does: select all, type. */
export async function typeInto(page, testid, text) {
  await reveal(page, testid);
  const field = page.getByTestId(testid);
  await field.click();
  await field.press('ControlOrMeta+a');
  if (text === '') await field.press('Backspace');
  else await field.pressSequentially(text);
}

/**
 * Registers the file's `before`/`after` hooks: one static server and one browser for all of
 * its tests. Read `env.server` and `env.browser` inside the tests.
 */
export function useServerAndBrowser({ before, after }) {
  const env = {};
  before(async () => {
    env.server = await serveDist();
    env.browser = await launch();
  });
  after(async () => {
    await env.browser?.close();
    await env.server?.close();
  });
  return env;
}

/** A fixture config.json of the core's tests, by name. */
export const fixture = (name) =>
  new URL(`../../core/tests/fixtures/configs/${name}.json`, import.meta.url);

/** Opens the page (with `query`) and switches to the architecture mode. */
export async function openArchitecturePage(env, query = '?gpu=none') {
  const opened = await openPage(env.browser, env.server.origin + '/' + query);
  await opened.page.getByTestId('mode-arch').check();
  await opened.page.getByTestId('model').waitFor();
  return opened;
}
