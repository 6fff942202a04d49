// The architecture mode in a real browser: presets, pasted and uploaded configs, broken
// configs, and shared links that carry a pasted config.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { useServerAndBrowser, openPage, bytesOf, typeInto, urlSettled, choose } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

const fixture = (name) => new URL(`../../core/tests/fixtures/configs/${name}.json`, import.meta.url);

async function archPage() {
  const opened = await openPage(env.browser, env.server.origin + '/?gpu=none');
  await opened.page.getByTestId('mode-arch').check();
  await opened.page.getByTestId('model').waitFor();
  return opened;
}

function within(actual, expected, percent) {
  const error = Math.abs(Number(actual) - expected) / expected * 100;
  assert.ok(error <= percent, `${actual} vs measured ${expected}: ${error.toFixed(2)}%`);
}

test('a preset gives PyTorch\'s parameter count and a peak within 3% of the measurement', async () => {
  const { page, errors, context } = await archPage();
  await page.getByTestId('model').selectOption('gpt2');
  assert.equal(await page.getByTestId('seq').inputValue(), '1024');
  await typeInto(page, 'batch', '4');
  await page.getByTestId('recipe').selectOption('amp-bf16');
  await page.getByTestId('optimizer').selectOption('adamw');
  await choose(page, 'attention', 'sdpa');
  await choose(page, 'checkpointing', 'none');
  assert.equal(await page.getByTestId('n-params').getAttribute('data-value'), '124439808');
  assert.equal(await page.getByTestId('peak-phase').getAttribute('data-phase'), 'bwd');
  // Measured with torch 2.15 (reference data): 7,482,281,472 bytes.
  within(await bytesOf(page, 'total'), 7_482_281_472, 3);

  // Eager attention keeps seq x seq probabilities: measured 11,707,780,608 bytes.
  await choose(page, 'attention', 'eager');
  within(await bytesOf(page, 'total'), 11_707_780_608, 3);
  // Checkpointing: measured 4,213,870,080 bytes.
  await choose(page, 'attention', 'sdpa');
  await choose(page, 'checkpointing', 'full');
  within(await bytesOf(page, 'total'), 4_213_870_080, 3);
  assert.deepEqual(errors, []);
  await context.close();
});

test('Llama-3-8B in bf16 peaks in the optimizer step at batch 1', async () => {
  const { page, context } = await archPage();
  await page.getByTestId('model').selectOption('llama3-8b');
  await typeInto(page, 'batch', '1');
  await page.getByTestId('recipe').selectOption('bf16');
  assert.equal(await page.getByTestId('peak-phase').getAttribute('data-phase'), 'opt');
  within(await bytesOf(page, 'total'), 80_302_778_880, 3);
  await context.close();
});

test('a pasted config is read, and travels in the URL', async () => {
  const { page, errors, context } = await archPage();
  await page.getByTestId('model').selectOption('custom');
  const config = await readFile(fixture('llama-1b'), 'utf8');
  await page.getByTestId('config-json').fill(config);
  await typeInto(page, 'seq', '2048');
  await typeInto(page, 'batch', '2');
  await page.getByTestId('recipe').selectOption('bf16');
  assert.equal(await page.getByTestId('n-params').getAttribute('data-value'), '1235814400');
  within(await bytesOf(page, 'total'), 20_909_136_896, 3);
  assert.equal(await page.getByTestId('config-json-error').textContent(), '');

  await urlSettled(page);
  const url = page.url();
  assert.match(url, /[?&]cfg=/);
  const other = await env.browser.newContext();
  const fresh = await other.newPage();
  await fresh.goto(url);
  await fresh.getByTestId('total').waitFor();
  assert.equal(await fresh.getByTestId('n-params').getAttribute('data-value'), '1235814400');
  assert.equal(await bytesOf(fresh, 'total'), await bytesOf(page, 'total'));
  assert.equal(await fresh.getByTestId('model').inputValue(), 'custom');
  await other.close();
  assert.deepEqual(errors, []);
  await context.close();
});

test('an uploaded config.json is read', async () => {
  const { page, context } = await archPage();
  await page.getByTestId('model').selectOption('custom');
  await page.getByTestId('config-file').setInputFiles(fileURLToPathSafe(fixture('bert-base')));
  await page.waitForFunction(() => document.querySelector('[data-testid="config-json"]').value.includes('bert'));
  // BERT's learned positions stop at 512 tokens: the page says so until the length fits.
  assert.match(await page.getByTestId('total').textContent(), /at most 512 tokens/);
  await typeInto(page, 'seq', '512');
  await page.waitForFunction(() => document.querySelector('[data-testid="n-params"]')?.dataset.value === '109514298');
  await context.close();
});

function fileURLToPathSafe(url) {
  return decodeURIComponent(url.pathname);
}

test('a broken config gets a clear message and the page keeps working', async () => {
  const { page, errors, context } = await archPage();
  await page.getByTestId('model').selectOption('custom');
  const cases = [
    ['{"model_type": "gpt2", "n_embd": 768', /JSON/i],
    ['{"model_type": "mamba", "hidden_size": 768}', /mamba/],
    ['{"model_type": "llama", "hidden_size": 2048}', /num_hidden_layers|missing/i],
    ['<script>alert(1)</script>', /JSON/i],
  ];
  for (const [text, message] of cases) {
    await page.getByTestId('config-json').fill(text);
    assert.match(await page.getByTestId('config-json-error').textContent(), message, text);
    assert.equal(await bytesOf(page, 'total'), null);
    assert.match(await page.getByTestId('total').textContent(), /cannot be used/);
  }
  // The rest still works: back to a preset.
  await page.getByTestId('model').selectOption('qwen2.5-0.5b');
  assert.ok((await bytesOf(page, 'total')) > 0n);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a sequence longer than GPT-2 can take is a clear error at the field', async () => {
  const { page, context } = await archPage();
  await page.getByTestId('model').selectOption('gpt2');
  await typeInto(page, 'seq', '4096');
  assert.match(await page.getByTestId('total').textContent(), /1024/);
  await typeInto(page, 'seq', 'abc');
  assert.match(await page.getByTestId('seq-error').textContent(), /Not a number/);
  await context.close();
});

test('the simple mode is unchanged beside it', async () => {
  const { page, context } = await archPage();
  await page.getByTestId('mode-simple').check();
  assert.equal(await bytesOf(page, 'total'), 102_096_000_000n);
  await context.close();
});
