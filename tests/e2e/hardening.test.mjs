// Hostile links and storage, privacy, accessibility (axe-core) and keyboard-only use.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { useServerAndBrowser, openPage, bytesOf } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

/** A small deterministic PRNG, so a failing case can be replayed. */
function prng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

const keys = ['m', 'p', 'pu', 'pr', 'o', 'b', 'a', 'u', 'model', 'cfg', 's', 'r', 'attn', 'gc', 'gen', 'gpu', 'cap', 'ctx', 'res', 'margin', 'n', 'gpus', 'shard', 'tp', 'pp', 'gb'];
const payloads = [
  '<script>window.__pwned=1</script>',
  '"><img src=x onerror="window.__pwned=1">',
  "'\"><svg/onload=window.__pwned=1>",
  'javascript:window.__pwned=1',
];

function hostileQueries() {
  const queries = [];
  const rand = prng(20261202);
  for (let i = 0; i < 12; i++) {
    const bytes = Array.from({ length: 1 + Math.floor(rand() * 200) }, () => Math.floor(rand() * 256));
    queries.push('zz=1&' + bytes.map((b) => '%' + b.toString(16).padStart(2, '0')).join(''));
    queries.push('zz=1&' + String.fromCharCode(...bytes.map((b) => 33 + (b % 90))));
  }
  for (const key of keys) {
    queries.push(`${key}=${encodeURIComponent(payloads[queries.length % payloads.length])}`);
  }
  queries.push(
    'b=%', 'b=%2', 'b=%zz', 'p=%E2%82', 'b=%C0%AF', 'a=%FF%FE',
    'b=1&b=2&b=3', 'p=1&p=1e400', 'zz=1&yy=2&b=8&xx=3',
    'b=' + '9'.repeat(100_000), 'cfg=' + 'x'.repeat(100_000) + '&model=custom', 'p=' + 'é'.repeat(50_000),
    'p=1e400', 'b=-0', 'a=NaN', 'p=Infinity', 'b=0x10', 'b=1e-400', 'a=-1e-9', 'n=0', 'tp=0', 'margin=100',
    'b=%F0%9F%98%80', 'p=%E2%80%AE7', 'model=%00', 'gpu=%E2%80%8Bh100-80',
    'model=custom&cfg=' + encodeURIComponent('{"model_type":"llama","num_hidden_layers":1e400}'),
    'model=custom&cfg=' + encodeURIComponent('{"model_type":"gpt2","n_layer":-1}'),
    'model=custom&cfg=' + encodeURIComponent('[' .repeat(5000)),
    'm=arch&model=custom',
    '=&=&&==',
  );
  return queries;
}

test('at least 50 hostile links: the page renders, says what it ignored, throws nothing, runs nothing', async () => {
  const queries = hostileQueries();
  assert.ok(queries.length >= 50, `${queries.length} cases`);
  const context = await env.browser.newContext();
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
  let dialogs = 0;
  page.on('dialog', (d) => {
    dialogs++;
    d.dismiss();
  });
  for (const query of queries) {
    const label = query.slice(0, 60);
    await page.goto(`${env.server.origin}/?${query}`);
    await page.getByTestId('total').waitFor();
    assert.ok((await page.getByTestId('notice').count()) >= 1, `no notice for ${label}`);
    assert.equal(await page.evaluate(() => window.__pwned), undefined, `script ran for ${label}`);
    assert.equal(await page.locator('img[src="x"], script:not([type="module"])').count(), 0, label);
    assert.deepEqual(errors, [], label);
  }
  assert.equal(dialogs, 0);
  await context.close();
});

test('garbage or missing localStorage is handled like a bad link', async () => {
  for (const stored of ['\u0000\u0001', 'b=%%%', 'x'.repeat(200_000), '{"json": true}', payloads[1]]) {
    const context = await env.browser.newContext();
    await context.addInitScript((value) => {
      if (!sessionStorage.getItem('seeded')) {
        localStorage.setItem('batch-size-memory-estimator:v1', value);
        sessionStorage.setItem('seeded', '1');
      }
    }, stored);
    const page = await context.newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(env.server.origin);
    await page.getByTestId('total').waitFor();
    assert.ok((await page.getByTestId('notice').count()) >= 1, stored.slice(0, 20));
    assert.equal(await bytesOf(page, 'total'), 102_096_000_000n);
    assert.deepEqual(errors, []);
    await context.close();
  }
  // A browser that refuses storage altogether (some private windows).
  const context = await env.browser.newContext();
  await context.addInitScript(() => {
    Object.defineProperty(window, 'localStorage', { get() { throw new DOMException('denied', 'SecurityError'); } });
  });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(env.server.origin);
  await page.getByTestId('total').waitFor();
  assert.equal(await bytesOf(page, 'total'), 102_096_000_000n);
  await page.getByTestId('batch').fill('16');
  assert.equal(await bytesOf(page, 'activations'), 8_192_000_000n);
  assert.deepEqual(errors, []);
  await context.close();
});

test('every request stays on the page origin, in every mode, a Hub id typed included', async () => {
  const { page, requests, errors, context } = await openPage(env.browser, env.server.origin, {
    permissions: ['clipboard-read', 'clipboard-write'],
    origin: env.server.origin,
  });
  await page.getByTestId('copy-sweep').click();
  await page.getByTestId('mode-arch').check();
  for (const model of ['gpt2', 'vit-b16', 'custom']) await page.getByTestId('model').selectOption(model);
  await page.getByTestId('config-json').fill('{"model_type":"gpt2","n_layer":2,"n_embd":64,"n_head":2,"vocab_size":100,"n_positions":64}');
  // a Hub id typed, and Enter, but no click on Fetch: nothing is sent
  await page.getByTestId('hub-id').fill('Qwen/Qwen3-0.6B');
  await page.getByTestId('hub-id').press('Enter');
  await page.getByTestId('gpu').selectOption('h200');
  await page.getByTestId('optimizer').selectOption('none');
  await page.waitForLoadState('networkidle');
  const csp = await page.locator('meta[http-equiv="Content-Security-Policy"]').getAttribute('content');
  assert.match(csp, /default-src 'self'/);
  assert.doesNotMatch(csp, /unsafe-inline|\*/);
  // one host beyond the page's own, for the Hub's config.json on a click (hub.test.mjs)
  assert.match(csp, /(^|; )connect-src 'self' https:\/\/huggingface\.co(;|$)/);
  const foreign = requests.filter((u) => !u.startsWith(env.server.origin + '/'));
  assert.deepEqual(foreign, []);
  assert.deepEqual(errors, [], 'no CSP violation or other error');
  await context.close();
});

const require = createRequire(import.meta.url);
const axeSource = await readFile(require.resolve('axe-core/axe.min.js'), 'utf8');

for (const colorScheme of ['light', 'dark']) {
  for (const query of ['', 'm=arch&model=llama3-8b&gpu=h100-80&n=8&shard=zero3&gb=512', 'm=arch&model=custom&gpu=custom&o=none', 'b=abc',
    // notes above the breakdown and the saved-activation sub-list under Activations
    'm=arch&model=gemma3-4b&b=8&gpu=none',
    // a custom model: the Hub id field with its button, the config's text area
    `m=arch&model=custom&s=64&gpu=none&cfg=${encodeURIComponent('{"model_type":"gpt2","n_layer":2,"n_embd":64,"n_head":2,"vocab_size":100,"n_positions":64}')}`]) {
    test(`axe-core: no serious or critical violation (${colorScheme}, ?${query || 'defaults'})`, async () => {
      // The audit script is injected by the test, so this context alone bypasses the CSP.
      const context = await env.browser.newContext({ colorScheme, bypassCSP: true });
      const page = await context.newPage();
      await page.goto(`${env.server.origin}/?${query}`);
      await page.getByTestId('total').waitFor();
      if (query.includes('cfg=')) assert.ok(await page.getByTestId('hub-fetch').isVisible());
      await page.evaluate(axeSource);
      const results = await page.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }));
      const bad = results.violations
        .filter((v) => v.impact === 'serious' || v.impact === 'critical')
        .map((v) => `${v.id}: ${v.nodes.map((n) => n.target.join(' ')).slice(0, 3).join(', ')}`);
      assert.deepEqual(bad, []);
      await context.close();
    });
  }
}

/** Presses Tab until the element with `testid` has focus, as a keyboard user would. */
async function tabTo(page, testid, limit = 120) {
  for (let i = 0; i < limit; i++) {
    if ((await page.evaluate(() => document.activeElement?.dataset?.testid)) === testid) return;
    await page.keyboard.press('Tab');
  }
  throw new Error(`${testid} is not reachable with Tab`);
}

test('keyboard only: reach and change every control, then copy the table', async () => {
  const context = await env.browser.newContext();
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: env.server.origin });
  const page = await context.newPage();
  await page.goto(env.server.origin + '/?gpu=none');
  await page.getByTestId('total').waitFor();

  await tabTo(page, 'params');
  await page.keyboard.press('ControlOrMeta+a');
  await page.keyboard.type('13');
  await tabTo(page, 'params-unit');
  await page.keyboard.press('ArrowUp'); // B -> M
  await tabTo(page, 'precision');
  await page.keyboard.press('ArrowUp'); // FP16 -> FP32
  await tabTo(page, 'optimizer');
  await page.keyboard.press('ArrowDown'); // AdamW -> SGD with momentum
  await tabTo(page, 'batch');
  await page.keyboard.press('ControlOrMeta+a');
  await page.keyboard.type('2');
  await tabTo(page, 'act-mb');
  await page.keyboard.press('ControlOrMeta+a');
  await page.keyboard.type('100');
  assert.equal(await bytesOf(page, 'weights'), 52_000_000n);
  assert.equal(await bytesOf(page, 'optimizer-states'), 52_000_000n);
  assert.equal(await bytesOf(page, 'activations'), 200_000_000n);

  await tabTo(page, 'gpu');
  await page.keyboard.press('ArrowDown');
  assert.notEqual(await page.getByTestId('gpu').inputValue(), 'none');
  await tabTo(page, 'num-gpus');
  // the folded sections open from the keyboard: Enter on the summary, then Tab into them
  await tabTo(page, 'fold-parallel-summary');
  await page.keyboard.press('Enter');
  for (const id of ['sharding', 'global-batch', 'fold-overheads-summary']) {
    await tabTo(page, id);
  }
  await page.keyboard.press('Enter');
  for (const id of ['cuda-context', 'allocator-reserve', 'safety-margin']) {
    await tabTo(page, id);
  }
  await tabTo(page, 'unit-gb');
  await page.keyboard.press('ArrowDown');
  assert.equal(await page.getByTestId('unit-gib').isChecked(), true);

  await tabTo(page, 'copy-sweep');
  await page.keyboard.press('Enter');
  await page.getByTestId('copy-sweep').getByText('Copied!').waitFor();
  const text = await page.evaluate(() => navigator.clipboard.readText());
  assert.match(text, /\| \*\*2\*\* \|/);
  assert.match(text, /GiB/);

  // The mode switch and the architecture controls are reachable too.
  await page.keyboard.press('Shift+Tab');
  await tabTo(page, 'mode-simple');
  await page.keyboard.press('ArrowDown');
  assert.equal(await page.getByTestId('mode-arch').isChecked(), true);
  for (const id of ['model', 'seq', 'recipe', 'optimizer', 'trainer', 'method', 'batch', 'fold-step-summary']) {
    await tabTo(page, id);
  }
  // (a link without the optimizer kernel is foreach, which no trainer sets: the section of
  // the step's settings is open already and says so)
  if ((await page.getByTestId('fold-step').getAttribute('open')) === null) await page.keyboard.press('Enter');
  // the parallelism section stays open as the person left it
  for (const id of ['optimizer-impl', 'attention', 'checkpointing', 'compile', 'tensor-parallel']) {
    await tabTo(page, id);
  }
  await context.close();
});
