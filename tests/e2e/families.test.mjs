// The model families people fine-tune today, in a real browser: each family's config.json
// pasted into the page gives PyTorch's parameter count and a peak; the picker groups the
// presets by family; notes and the saved-activation sub-list show next to the estimate.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { useServerAndBrowser, bytesOf, typeInto, fixture, openArchitecturePage, choose } from './harness.mjs';

const env = useServerAndBrowser({ before, after });


const archPage = (query) => openArchitecturePage(env, query);

/**
 * Pastes `core/tests/fixtures/configs/<name>.json` as a custom model at batch 8 of 512 tokens
 * (every family takes 512 tokens).
 */
async function pasteConfig(page, name) {
  await page.getByTestId('model').selectOption('custom');
  await typeInto(page, 'seq', '512');
  await typeInto(page, 'batch', '8');
  await page.getByTestId('config-json').fill(await readFile(fixture(name), 'utf8'));
}

/** The saved parts listed under Activations, as { key: bytes }. */
async function savedParts(page) {
  const entries = await page.evaluate(() =>
    [...document.querySelectorAll('[data-testid^="saved-part-"]')]
      .map((el) => [el.dataset.testid.slice('saved-part-'.length), el.dataset.bytes]));
  return Object.fromEntries(entries.map(([key, bytes]) => [key, BigInt(bytes)]));
}

// PyTorch's parameter counts (transformers on the meta device, see core's preset tests).
const families = [
  ['qwen3-0.6b', 596_049_920],
  ['gemma2-2b', 2_614_341_888],
  ['gemma3-1b', 999_885_952],
  // the multimodal config: its SigLIP tower and projector counted without images too
  ['gemma3-4b', 4_300_079_472],
  ['olmo2-1b', 1_484_916_736],
  ['smollm3-3b', 3_075_098_624],
  ['granite3.3-2b', 2_533_539_840],
  ['phi4-mini', 3_836_021_760],
  ['llama3.2-3b', 3_212_749_824],
  ['roberta-base', 124_697_433],
  ['xlm-roberta-base', 278_295_186],
  ['mistral-7b', 7_241_732_096],
  ['qwen2.5-0.5b', 494_032_768],
  // norms after each sub-block, per-head q/k norms (the 1.2B: every layer global)
  ['exaone4-1.2b', 1_279_391_488],
];

for (const [name, nParams] of families) {
  test(`a pasted ${name} config.json gives PyTorch's parameter count and a peak`, async () => {
    const { page, errors, context } = await archPage();
    await pasteConfig(page, name);
    assert.equal(await page.getByTestId('config-json-error').textContent(), '', name);
    assert.equal(await page.getByTestId('n-params').getAttribute('data-value'), String(nParams), name);
    const peak = await bytesOf(page, 'total');
    assert.ok(peak > 0n, `${name}: peak ${peak}`);
    // The saved parts add up to the activations line (none when the peak is in the optimizer
    // step, where no activations are alive); the categories still add up to the peak.
    const activations = await bytesOf(page, 'activations');
    const parts = await savedParts(page);
    assert.equal(Object.keys(parts).length > 0, activations > 0n, `${name}: ${activations}`);
    assert.equal(Object.values(parts).reduce((a, b) => a + b, 0n), activations, name);
    const categories = ['weights', 'gradients', 'optimizer-states', 'activations', 'temporaries', 'buffers', 'kv-cache'];
    let sum = 0n;
    for (const id of categories) sum += (await page.getByTestId(id).count()) ? await bytesOf(page, id) : 0n;
    assert.equal(sum, peak, name);
    if (name === 'gemma3-4b') {
      assert.match(await page.getByTestId('model-notes').textContent(), /weights are counted with or without images/);
    }
    if (name === 'gemma2-2b') {
      assert.match(await page.getByTestId('model-notes').textContent(), /eager attention/);
      assert.ok(parts['soft-capping'] > 0n && parts['post-norms'] > 0n, JSON.stringify(Object.keys(parts)));
    }
    if (name === 'qwen3-0.6b') {
      assert.ok(parts['qk-norms'] > 0n);
      assert.ok(await page.getByTestId('model-notes').isHidden());
    }
    assert.deepEqual(errors, []);
    await context.close();
  });
}

test('an unsupported model_type names the supported ones next to the field', async () => {
  const { page, errors, context } = await archPage();
  await page.getByTestId('model').selectOption('custom');
  await page.getByTestId('config-json').fill('{"model_type": "t5", "d_model": 768}');
  const message = await page.getByTestId('config-json-error').textContent();
  assert.match(message, /"t5" is not supported/);
  for (const type of ['qwen3', 'gemma2', 'gemma3', 'olmo2', 'smollm3', 'granite', 'roberta', 'xlm-roberta']) {
    assert.ok(message.split(/[\s,()]+/).includes(type), `${type} missing from: ${message}`);
  }
  assert.equal(await bytesOf(page, 'total'), null);
  assert.ok(await page.getByTestId('model-notes').isHidden());
  // a recurrent (state-space) family vLLM serves is refused with why
  await page.getByTestId('config-json').fill('{"model_type": "mamba", "hidden_size": 768}');
  await page.getByTestId('config-json-error').getByText('"mamba" has linear-attention or state-space layers').waitFor();
  assert.deepEqual(errors, []);
  await context.close();
});

test('the picker groups presets by family, keeps Custom last, and a choice updates the URL', async () => {
  const { page, errors, context } = await archPage();
  const picker = page.getByTestId('model');
  const groups = await picker.evaluate((select) =>
    [...select.querySelectorAll('optgroup')].map((g) => [g.label, g.querySelectorAll('option').length]));
  assert.ok(groups.length >= 10, JSON.stringify(groups));
  const labels = groups.map(([label]) => label);
  for (const family of ['Llama', 'Qwen3', 'Gemma 3', 'Gemma 2', 'OLMo 2', 'SmolLM3', 'Granite', 'RoBERTa']) {
    assert.ok(labels.includes(family), `${family} not in ${labels}`);
  }
  assert.equal(new Set(labels).size, labels.length, 'one group per family');
  const last = await picker.evaluate((select) => {
    const option = select.options[select.options.length - 1];
    return [option.value, option.parentElement.tagName];
  });
  assert.deepEqual(last, ['custom', 'SELECT']);
  assert.equal(
    await picker.evaluate((select) => select.querySelector('option[value="qwen3-8b"]').parentElement.label),
    'Qwen3',
  );

  await picker.selectOption('qwen3-8b');
  assert.equal(await page.getByTestId('n-params').getAttribute('data-value'), '8190735360');
  await page.waitForFunction(() => new URLSearchParams(location.search).get('model') === 'qwen3-8b');
  assert.ok((await bytesOf(page, 'total')) > 0n);
  assert.deepEqual(errors, []);
  await context.close();
});

test('preset keys of older links still open their model', async () => {
  for (const [key, nParams] of [['phi3-mini', '3821079552'], ['llama3.2-1b', '1235814400'], ['gpt2', '124439808']]) {
    const { page, errors, context } = await archPage(`?m=arch&model=${key}&s=1024&gpu=none`);
    assert.equal(await page.getByTestId('model').inputValue(), key);
    assert.equal(await page.getByTestId('n-params').getAttribute('data-value'), nParams, key);
    assert.ok(await page.getByTestId('notices').isHidden(), key);
    assert.deepEqual(errors, []);
    await context.close();
  }
});

test('a Gemma 3 preset shows its notes; the saved parts follow the checkpointing', async () => {
  const { page, errors, context } = await archPage('?m=arch&model=gemma3-4b&gpu=none&b=8');
  assert.equal(await page.getByTestId('n-params').getAttribute('data-value'), '3880263168');
  assert.match(await page.getByTestId('model-notes').textContent(), /language model/);
  let parts = await savedParts(page);
  assert.ok(parts['qk-norms'] > 0n && parts['post-norms'] > 0n, JSON.stringify(Object.keys(parts)));
  await choose(page, 'checkpointing', 'full');
  parts = await savedParts(page);
  assert.ok(parts['layer-inputs'] > 0n, JSON.stringify(Object.keys(parts)));
  assert.equal(parts['mlp'], undefined);
  // Simple mode has no notes and no sub-list.
  await page.getByTestId('mode-simple').check();
  assert.ok(await page.getByTestId('model-notes').isHidden());
  assert.deepEqual(await savedParts(page), {});
  assert.deepEqual(errors, []);
  await context.close();
});
