// The simple mode, driven as a person would: type, read the figures, switch units, copy
// the tables, share the link, reload, and try bad values.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, openPage, bytesOf, typeInto, urlSettled } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

const clipboard = ['clipboard-read', 'clipboard-write'];

test('the defaults show the example of the issue, to the byte', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin);
  assert.equal(await bytesOf(page, 'weights'), 14_000_000_000n);
  assert.equal(await bytesOf(page, 'gradients'), 28_000_000_000n);
  assert.equal(await bytesOf(page, 'optimizer-states'), 56_000_000_000n);
  assert.equal(await bytesOf(page, 'activations'), 4_096_000_000n);
  assert.equal(await bytesOf(page, 'total'), 102_096_000_000n);
  assert.match(await page.getByTestId('total').textContent(), /102\.10 GB/);
  assert.deepEqual(errors, []);
  await context.close();
});

test('typing updates the figures without a button', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin);
  await typeInto(page, 'params', '7000');
  await page.getByTestId('params-unit').selectOption('M');
  assert.equal(await bytesOf(page, 'weights'), 14_000_000_000n);
  await typeInto(page, 'params', '0.5');
  await page.getByTestId('params-unit').selectOption('B');
  await page.getByTestId('precision').selectOption('fp32');
  assert.equal(await bytesOf(page, 'weights'), 2_000_000_000n);
  await page.getByTestId('optimizer').selectOption('sgd-momentum');
  assert.equal(await bytesOf(page, 'optimizer-states'), 2_000_000_000n);
  await page.getByTestId('optimizer').selectOption('none');
  assert.equal(await bytesOf(page, 'gradients'), 0n);
  assert.equal(await bytesOf(page, 'optimizer-states'), 0n);
  await typeInto(page, 'batch', '3');
  await typeInto(page, 'act-mb', '0.25');
  assert.equal(await bytesOf(page, 'activations'), 750_000n);
  assert.equal(await bytesOf(page, 'total'), 2_000_750_000n);
  const selected = page.locator('[data-testid="sweep-row"].selected');
  assert.equal(await selected.getAttribute('data-batch'), '3');
  assert.deepEqual(errors, []);
  await context.close();
});

test('the GiB switch changes only what is shown', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin);
  const before = await bytesOf(page, 'total');
  await page.getByTestId('unit-gib').check();
  assert.match(await page.getByTestId('total').textContent(), /95\.08 GiB/);
  assert.equal(await bytesOf(page, 'total'), before);
  assert.match(await page.getByTestId('sweep-table').textContent(), /GiB/);
  await page.getByTestId('unit-gb').check();
  assert.match(await page.getByTestId('total').textContent(), /102\.10 GB/);
  await context.close();
});

test('the sweep has powers of two around the chosen batch, which is highlighted', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin);
  await typeInto(page, 'batch', '12');
  const rows = page.getByTestId('sweep-row');
  await page.locator('[data-testid="sweep-row"][data-batch="12"]').waitFor();
  const batches = await rows.evaluateAll((rs) => rs.map((r) => Number(r.dataset.batch)));
  assert.deepEqual(batches, [1, 2, 4, 8, 12, 16, 32, 64]);
  const selected = await rows.evaluateAll((rs) => rs.filter((r) => r.classList.contains('selected')).map((r) => r.dataset.batch));
  assert.deepEqual(selected, ['12']);
  await context.close();
});

test('copy as Markdown and as TSV, then read the clipboard', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin, { permissions: clipboard, origin: env.server.origin });
  await page.getByTestId('copy-sweep').click();
  await page.getByTestId('copy-sweep').getByText('Copied!').waitFor();
  const markdown = await page.evaluate(() => navigator.clipboard.readText());
  const lines = markdown.trim().split('\n');
  assert.equal(lines[0], '| Batch Size | Weights + Grad + Opt (GB) | Activations (GB) | Peak (GB) | Fits |');
  assert.equal(lines[1], '| ---: | ---: | ---: | ---: | ---: |');
  // 102 GB does not fit the default H100 80 GB.
  assert.ok(lines.includes('| **8** | **98.00** | **4.10** | **102.10** | **no** |'), markdown);
  assert.equal(lines.length, 2 + 7);

  await page.getByTestId('unit-gib').check();
  await page.getByTestId('copy-sweep-tsv').click();
  await page.getByTestId('copy-sweep-tsv').getByText('Copied!').waitFor();
  const tsv = await page.evaluate(() => navigator.clipboard.readText());
  const rows = tsv.trim().split('\n').map((l) => l.split('\t'));
  assert.deepEqual(rows[0], ['Batch Size', 'Weights + Grad + Opt (GiB)', 'Activations (GiB)', 'Peak (GiB)', 'Fits', 'Selected']);
  assert.deepEqual(rows.find((r) => r[0] === '8'), ['8', '91.27', '3.81', '95.08', 'no', 'yes']);

  await page.getByTestId('gpu').selectOption('none');
  await page.getByTestId('copy-sweep').click();
  await page.waitForFunction(async () => !(await navigator.clipboard.readText()).includes('Fits'));
  await context.close();
});

test('a refused clipboard says what went wrong', async () => {
  const context = await env.browser.newContext();
  await context.addInitScript(() => {
    navigator.clipboard.writeText = () => Promise.reject(new DOMException('Write permission denied.', 'NotAllowedError'));
  });
  const page = await context.newPage();
  await page.goto(env.server.origin);
  await page.getByTestId('copy-sweep').click();
  const status = page.getByTestId('copy-sweep-status');
  await status.getByText(/Copy failed/).waitFor();
  assert.match(await status.textContent(), /refused the clipboard/);
  assert.equal(await page.getByTestId('copy-sweep').textContent(), 'Copy as Markdown');
  await context.close();
});

async function fieldValues(page) {
  const values = {};
  for (const id of ['params', 'params-unit', 'precision', 'optimizer', 'batch', 'act-mb']) {
    values[id] = await page.getByTestId(id).inputValue();
  }
  values.gib = await page.getByTestId('unit-gib').isChecked();
  values.total = await bytesOf(page, 'total');
  return values;
}

test('the URL holds every input and opens the same page elsewhere', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin);
  const historyBefore = await page.evaluate(() => history.length);
  await typeInto(page, 'params', '13');
  await page.getByTestId('precision').selectOption('fp32');
  await page.getByTestId('optimizer').selectOption('sgd-momentum');
  await typeInto(page, 'batch', '32');
  await typeInto(page, 'act-mb', '96.5');
  await page.getByTestId('unit-gib').check();
  await urlSettled(page);
  const url = page.url();
  assert.match(url, /[?&]b=32(&|$)/);
  const expected = await fieldValues(page);
  const historyAfter = await page.evaluate(() => history.length);
  assert.equal(historyAfter, historyBefore, 'typing replaces the history entry instead of pushing');

  const other = await env.browser.newContext();
  const fresh = await other.newPage();
  await fresh.goto(url);
  await fresh.getByTestId('total').waitFor();
  assert.deepEqual(await fieldValues(fresh), expected);
  assert.ok(await fresh.getByTestId('notices').isHidden());
  await other.close();
  await context.close();
});

test('a reload keeps the inputs, and the URL wins over storage', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin);
  await typeInto(page, 'batch', '24');
  await page.getByTestId('precision').selectOption('int8');
  await page.goto(env.server.origin + '/');
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('batch').inputValue(), '24');
  assert.equal(await page.getByTestId('precision').inputValue(), 'int8');

  await page.goto(env.server.origin + '/?b=2');
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('batch').inputValue(), '2');
  assert.equal(await page.getByTestId('precision').inputValue(), 'fp16');
  await context.close();
});

test('bad values get a message at their field and the rest keeps working', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin);
  const cases = [
    ['batch', '', /Enter a number/],
    ['batch', '0', /greater than zero/],
    ['batch', '-4', /positive/],
    ['batch', 'eight', /Not a number/],
    ['batch', '2.5', /whole number of samples/],
    ['batch', '1000000000000', /Too large/],
    ['params', '1e30', /Too large/],
    ['params', 'NaN', /Not a number/],
    ['act-mb', '-1', /positive/],
    ['act-mb', '1e400', /Too large/],
  ];
  for (const [field, text, message] of cases) {
    await typeInto(page, field, text);
    const error = page.getByTestId(`${field}-error`);
    assert.match(await error.textContent(), message, `${field} = ${JSON.stringify(text)}`);
    assert.equal(await page.getByTestId(field).getAttribute('aria-invalid'), 'true');
    assert.equal(await bytesOf(page, 'total'), null);
    assert.match(await page.getByTestId('total').textContent(), /Fix the highlighted fields/);
    // The rest of the page still responds.
    await page.getByTestId('unit-gib').check();
    await page.getByTestId('unit-gb').check();
    await typeInto(page, field, field === 'params' ? '7' : field === 'batch' ? '8' : '512');
    assert.equal(await page.getByTestId(`${field}-error`).textContent(), '');
    assert.equal(await bytesOf(page, 'total'), 102_096_000_000n);
  }
  // Far past 64 bits: an explicit "too large", not a wrapped number.
  await typeInto(page, 'params', '99999');
  await page.getByTestId('precision').selectOption('fp32');
  await typeInto(page, 'batch', '16000000');
  await typeInto(page, 'act-mb', '9000000');
  assert.match(await page.getByTestId('total').textContent(), /too large/i);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a malformed link falls back to defaults with a notice naming the bad parts', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin + '/?b=abc&p=-3&pr=fp64&zz=1&a=%E0%A4');
  const notices = await page.getByTestId('notice').allTextContents();
  assert.equal(notices.length, 5, notices.join('\n'));
  assert.ok(notices.some((n) => n.includes('batch size') && n.includes('abc')));
  assert.ok(notices.some((n) => n.includes('zz')));
  assert.equal(await page.getByTestId('batch').inputValue(), '8');
  assert.equal(await bytesOf(page, 'total'), 102_096_000_000n);
  await page.getByTestId('dismiss-notices').click();
  assert.ok(await page.getByTestId('notices').isHidden());
  assert.deepEqual(errors, []);
  await context.close();
});

test('garbage in storage falls back to defaults with a notice', async () => {
  const context = await env.browser.newContext();
  await context.addInitScript(() => {
    if (!sessionStorage.getItem('seeded')) {
      localStorage.setItem('batch-size-memory-estimator:v1', '"b=%%%&pr=<script>alert(1)</script>"');
      sessionStorage.setItem('seeded', '1');
    }
  });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(env.server.origin);
  await page.getByTestId('total').waitFor();
  const notices = await page.getByTestId('notice').allTextContents();
  assert.ok(notices.length >= 2 && notices.every((n) => n.startsWith('Saved inputs')), notices.join('\n'));
  assert.equal(await bytesOf(page, 'total'), 102_096_000_000n);
  assert.deepEqual(errors, []);
  await context.close();
});

test('no request leaves the page origin', async () => {
  const { page, requests, context } = await openPage(env.browser, env.server.origin, { permissions: clipboard, origin: env.server.origin });
  await typeInto(page, 'batch', '16');
  await page.getByTestId('copy-sweep').click();
  await page.waitForLoadState('networkidle');
  const foreign = requests.filter((u) => !u.startsWith(env.server.origin + '/'));
  assert.deepEqual(foreign, []);
  await context.close();
});
