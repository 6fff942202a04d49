// A model opened by its Hugging Face Hub id. Every request to the Hub is intercepted
// (playwright's route fulfilment with the core's fixture configs, error statuses, a network
// failure, an answer that never comes): nothing here reaches the network. The page sends the
// request on the button's click only, reads the answer as a pasted config, and keeps it in
// the page's state: a reload and the shared link show the model again with no request.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { useServerAndBrowser, typeInto, fixture, urlSettled } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

const HUB = 'https://huggingface.co/';
const QWEN3_PARAMS = '596049920';

/**
 * Opens the page on a custom model with every request that leaves its origin
 * intercepted from the start and recorded: the Hub's answered by `answer` (called with the
 * route; it fulfils or aborts it), any other aborted. `clock`: playwright's fake timers.
 */
async function openWithHub(answer, query = '?m=arch&gpu=none', { clock = false } = {}) {
  const context = await env.browser.newContext();
  const hub = [];
  await context.route(
    (url) => !url.href.startsWith(env.server.origin + '/'),
    async (route) => {
      const request = route.request();
      hub.push({ url: request.url(), method: request.method(), headers: await request.allHeaders() });
      if (request.url().startsWith(HUB)) await answer(route);
      else await route.abort();
    },
  );
  const page = await context.newPage();
  if (clock) await page.clock.install();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text());
  });
  await page.goto(env.server.origin + '/' + query);
  await page.getByTestId('total').waitFor();
  // a link names the custom model only with its config
  if (!query.includes('cfg=')) await page.getByTestId('model').selectOption('custom');
  await page.getByTestId('hub-id').waitFor();
  return { page, context, hub, errors };
}

const fulfilWith = (name) => async (route) =>
  route.fulfill({
    status: 200,
    contentType: 'text/plain; charset=utf-8',
    headers: { 'access-control-allow-origin': '*' },
    body: await readFile(fixture(name), 'utf8'),
  });

/** Types `id` into the Hub field, clicks Fetch and waits for the button to be back. */
async function fetchHub(page, id) {
  await typeInto(page, 'hub-id', id);
  await page.getByTestId('hub-fetch').click();
  await page.waitForFunction(() => !document.querySelector('[data-testid="hub-fetch"]').disabled);
}

const paramsShown = (page) => page.getByTestId('n-params').getAttribute('data-value');

test('the Hub is asked on the click only; the model it answers is estimated, and a reload or the link restores it with no request', async () => {
  const { page, context, hub, errors } = await openWithHub(fulfilWith('qwen3-0.6b'));
  await typeInto(page, 'hub-id', 'Qwen/Qwen3-0.6B');
  await page.getByTestId('hub-id').press('Enter');
  await page.waitForLoadState('networkidle');
  await page.waitForTimeout(300);
  assert.deepEqual(hub, [], 'typing an id (and Enter) sends nothing');

  await page.getByTestId('hub-fetch').click();
  await page.waitForFunction(
    (n) => document.querySelector('[data-testid="n-params"]')?.dataset.value === n,
    QWEN3_PARAMS,
  );
  assert.equal(hub.length, 1);
  assert.equal(hub[0].url, `${HUB}Qwen/Qwen3-0.6B/resolve/main/config.json`);
  assert.equal(hub[0].method, 'GET');
  for (const header of ['cookie', 'authorization', 'referer']) {
    assert.equal(hub[0].headers[header], undefined, `no ${header} header`);
  }
  assert.equal(await page.getByTestId('hub-error').textContent(), '');
  assert.match(await page.getByTestId('config-json').inputValue(), /"model_type": "qwen3"/);

  // the state holds the config: a reload restores it offline, with no request
  await urlSettled(page);
  const link = await page.getByTestId('share-link').getAttribute('href');
  await page.reload();
  await page.getByTestId('total').waitFor();
  assert.equal(await paramsShown(page), QWEN3_PARAMS);
  await page.waitForLoadState('networkidle');
  assert.equal(hub.length, 1, 'a reload asks nothing');
  assert.deepEqual(errors, []);
  await context.close();

  // the shared link, in a fresh browser context
  const shared = await openWithHub(() => assert.fail('the link must not fetch'), link);
  assert.equal(await paramsShown(shared.page), QWEN3_PARAMS);
  await shared.page.waitForLoadState('networkidle');
  assert.deepEqual(shared.hub, []);
  assert.deepEqual(shared.errors, []);
  await shared.context.close();
});

test('a revision goes into the address, its slashes encoded', async () => {
  const { page, context, hub } = await openWithHub(fulfilWith('llama-1b'));
  await fetchHub(page, 'meta-llama/Llama-3.2-1B@refs/pr/1');
  assert.deepEqual(hub.map((r) => r.url), [`${HUB}meta-llama/Llama-3.2-1B/resolve/refs%2Fpr%2F1/config.json`]);
  assert.equal(await paramsShown(page), '1235814400');
  await context.close();
});

test('an id the Hub would refuse is refused before any request', async () => {
  const { page, context, hub } = await openWithHub(() => assert.fail('no request'));
  for (const id of ['gpt2', 'a/b/c', '../etc/passwd', 'a/b--c', 'a/b@../x', 'https://example.com/a/b']) {
    await fetchHub(page, id);
    assert.match(await page.getByTestId('hub-error').textContent(), /^Not a Hub id: /, id);
  }
  await page.waitForLoadState('networkidle');
  assert.deepEqual(hub, []);
  await context.close();
});

const status = (code, body = '') => (route) =>
  route.fulfill({ status: code, body, headers: { 'access-control-allow-origin': '*' } });

const failures = [
  ['gated (401)', status(401, '{"error":"Access to model is restricted"}'), /HTTP 401.*gated or private.*Log in on the Hub and paste the config instead/],
  ['private (403)', status(403), /HTTP 403.*gated or private.*paste the config instead/],
  ['not found (404)', status(404, 'Entry not found'), /Not found on the Hub \(HTTP 404\)/],
  ['a server error', status(503), /answered HTTP 503/],
  ['no network', (route) => route.abort('internetdisconnected'), /Could not reach huggingface\.co/],
  ['not JSON', status(200, '<!DOCTYPE html><html><body>Hello</body></html>'), /config is not a JSON object/],
  ['an unsupported model_type', status(200, '{"model_type":"t5"}'), /model_type "t5" is not supported \(supported: .*llama.*qwen3/],
  ['a config past the size cap (read until then)', status(200, `{"model_type":"gpt2","x":"${'x'.repeat(30_000)}"}`), /longer than 20000 characters/],
  ['a config announced past the size cap (not read)', status(200, 'x'.repeat(100_000)), /longer than 20000 characters/],
  ['a config past the depth limit', status(200, '['.repeat(5000) + ']'.repeat(5000)), /config is not a JSON object/],
];

for (const [what, answer, message] of failures) {
  test(`the Hub's answer: ${what} is said in hub-error, the model unchanged`, async () => {
    const { page, context, hub, errors } = await openWithHub(answer);
    await page.getByTestId('config-json').fill(await readFile(fixture('qwen2.5-0.5b'), 'utf8'));
    await page.waitForFunction(() => document.querySelector('[data-testid="n-params"]')?.dataset.value === '494032768');
    await fetchHub(page, 'some-org/some-model');
    assert.equal(hub.length, 1);
    const shown = await page.getByTestId('hub-error').textContent();
    assert.match(shown, /^some-org\/some-model: /);
    assert.match(shown, message);
    assert.equal(await paramsShown(page), '494032768', 'the pasted model stays');
    // the console reports the failed request itself (an error status, an aborted request)
    assert.deepEqual(errors.filter((e) => !/Failed to load resource/.test(e)), []);
    await context.close();
  });
}

test('an answer that never comes is given up after 15 s', async () => {
  let asked = 0;
  const { page, context } = await openWithHub(() => {
    asked += 1; // never answered
  }, undefined, { clock: true });
  await typeInto(page, 'hub-id', 'slow/model');
  await page.getByTestId('hub-fetch').click();
  await page.waitForFunction(() => document.querySelector('[data-testid="hub-fetch"]').disabled);
  assert.equal(asked, 1);
  await page.clock.fastForward(16_000);
  await page.waitForFunction(() => !document.querySelector('[data-testid="hub-fetch"]').disabled);
  assert.match(await page.getByTestId('hub-error').textContent(), /^slow\/model: No answer from huggingface\.co within 15 s/);
  await context.close();
});

test('a failed fetch, then one that succeeds: the message goes, the model comes', async () => {
  let answers = [status(404), fulfilWith('qwen3-0.6b')];
  const { page, context, hub } = await openWithHub((route) => answers.shift()(route));
  await fetchHub(page, 'Qwen/Qwen3-0.6B');
  assert.match(await page.getByTestId('hub-error').textContent(), /HTTP 404/);
  await page.getByTestId('hub-fetch').click();
  await page.waitForFunction(
    (n) => document.querySelector('[data-testid="n-params"]')?.dataset.value === n,
    QWEN3_PARAMS,
  );
  assert.equal(await page.getByTestId('hub-error').textContent(), '');
  assert.equal(hub.length, 2);
  await context.close();
});

// The Hub redirects large (LFS / Xet) files to other hosts, which the CSP does not allow:
// such an answer fails before any request goes there (config.json is a small file the Hub
// serves itself). (A redirect within huggingface.co, for a renamed repository, is followed
// by the browser; playwright does not route a fulfilled redirect's next request, so it is
// not tested here: it would reach the network.)
test('a redirect to another host is refused by the CSP, and said as unreachable', async () => {
  const { page, context, hub, errors } = await openWithHub((route) =>
    route.fulfill({
      status: 302,
      headers: { location: 'https://cdn-lfs.huggingface.co/repos/x/config.json', 'access-control-allow-origin': '*' },
    }));
  await fetchHub(page, 'lfs-owner/model');
  assert.match(await page.getByTestId('hub-error').textContent(), /^lfs-owner\/model: Could not reach huggingface\.co/);
  assert.deepEqual(hub.map((r) => r.url), [`${HUB}lfs-owner/model/resolve/main/config.json`], 'the CDN is never asked');
  assert.ok(errors.some((e) => /Content Security Policy/.test(e)), errors.join('\n'));
  assert.ok(!errors.some((e) => /ERR_NAME_NOT_RESOLVED/.test(e)), errors.join('\n'));
  await context.close();
});

test("the page's CSP lets it connect to its origin and huggingface.co only", async () => {
  const { page, context, hub } = await openWithHub(fulfilWith('qwen3-0.6b'));
  const csp = await page.locator('meta[http-equiv="Content-Security-Policy"]').getAttribute('content');
  assert.match(csp, /(^|; )connect-src 'self' https:\/\/huggingface\.co(;|$)/);
  const outcomes = await page.evaluate(async (urls) =>
    Promise.all(urls.map((u) => fetch(u).then(() => 'sent', () => 'blocked'))),
    ['https://example.com/', 'https://cdn-lfs.huggingface.co/x', 'http://huggingface.co/x', 'https://huggingface.co.evil.example/x']);
  assert.deepEqual(outcomes, ['blocked', 'blocked', 'blocked', 'blocked']);
  assert.deepEqual(hub, [], 'none of them left the page');
  await context.close();
});
