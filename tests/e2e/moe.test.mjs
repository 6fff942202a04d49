// Mixtures of experts in a real browser: each MoE family's config.json pasted into the page
// gives PyTorch's total and active parameter counts and a peak; expert parallelism lowers the
// per-GPU weights, travels in the URL, and a group that does not divide the GPUs is refused
// next to its field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import {
  useServerAndBrowser,
  bytesOf,
  typeInto,
  fixture,
  openArchitecturePage,
  urlSettled,
} from './harness.mjs';

const env = useServerAndBrowser({ before, after });


const archPage = (query) => openArchitecturePage(env, query);

// Total and active parameters (transformers on the meta device, see core's preset tests).
const families = [
  ['mixtral-8x7b', 46_702_792_704, 12_879_925_248],
  ['qwen3-30b-a3b', 30_532_122_624, 3_353_032_704],
  ['qwen1.5-moe-a2.7b', 14_315_784_192, 2_689_173_504],
  ['moonlight-16b-a3b', 15_960_108_544, 2_914_774_528],
  ['gpt-oss-20b', 20_914_757_184, 4_187_440_704],
];

const grouped = (n) => n.toLocaleString('en-US');

for (const [name, total, active] of families) {
  test(`a pasted ${name} config.json gives its total and active parameters and a peak`, async () => {
    const { page, errors, context } = await archPage();
    await page.getByTestId('model').selectOption('custom');
    await typeInto(page, 'seq', '512');
    await typeInto(page, 'batch', '2');
    await page.getByTestId('config-json').fill(await readFile(fixture(name), 'utf8'));
    assert.equal(await page.getByTestId('config-json-error').textContent(), '', name);
    assert.equal(await page.getByTestId('n-params').getAttribute('data-value'), String(total), name);
    const activeParams = page.getByTestId('active-params');
    assert.equal(await activeParams.getAttribute('data-value'), String(active), name);
    const summary = await page.getByTestId('n-params').locator('..').textContent();
    assert.ok(
      summary.includes(`${grouped(total)} parameters (${grouped(active)} active per token)`),
      `${name}: ${summary}`,
    );
    assert.ok((await bytesOf(page, 'total')) > 0n, name);
    const notes = await page.getByTestId('model-notes').textContent();
    assert.match(notes, /grouped experts/, name);
    if (name === 'gpt-oss-20b') {
      assert.match(notes, /only eager attention computes/);
      assert.match(notes, /MXFP4/);
      assert.match(notes, /dequantized/);
    } else {
      assert.doesNotMatch(notes, /MXFP4/, name);
    }
    // The expert-parallel field says what it does for a mixture of experts.
    assert.match(await page.getByTestId('expert-parallel-hint').textContent(), /routed experts/, name);
    assert.deepEqual(errors, []);
    await context.close();
  });
}

test('a dense model shows no active count and says expert parallelism has no effect', async () => {
  const { page, errors, context } = await archPage('?m=arch&model=qwen3-8b&gpu=none&n=8&ep=8');
  assert.equal(await page.getByTestId('n-params').getAttribute('data-value'), '8190735360');
  assert.equal(await page.getByTestId('active-params').count(), 0);
  assert.match(await page.getByTestId('expert-parallel-hint').textContent(), /no effect/);
  const weights = await bytesOf(page, 'weights');
  await typeInto(page, 'expert-parallel', '1');
  assert.equal(await bytesOf(page, 'weights'), weights);
  // Simple mode hides the field and shows no active count.
  await page.getByTestId('mode-simple').check();
  assert.equal(await page.getByTestId('expert-parallel').isVisible(), false);
  assert.equal(await page.getByTestId('active-params').count(), 0);
  assert.deepEqual(errors, []);
  await context.close();
});

test('expert parallelism lowers the per-GPU weights, travels in the URL and refuses a group that does not divide the GPUs', async () => {
  const { page, errors, context } = await archPage('?gpu=h200');
  await page.getByTestId('model').selectOption('qwen3-30b-a3b');
  await typeInto(page, 'batch', '1');
  await typeInto(page, 'num-gpus', '8');
  assert.equal(await page.getByTestId('expert-parallel').inputValue(), '1');
  const weightsEp1 = await bytesOf(page, 'weights');
  const totalEp1 = await bytesOf(page, 'total');
  assert.ok(weightsEp1 > 0n);

  await typeInto(page, 'expert-parallel', '8');
  const weightsEp8 = await bytesOf(page, 'weights');
  assert.ok(weightsEp8 * 4n < weightsEp1, `EP 8: ${weightsEp8} against EP 1: ${weightsEp1}`);
  assert.ok((await bytesOf(page, 'total')) < totalEp1);
  assert.match(await page.getByTestId('per-gpu-note').textContent(), /per GPU/);
  await page.waitForFunction(() => new URLSearchParams(location.search).get('ep') === '8');
  const params = new URL(page.url()).searchParams;
  assert.equal(params.get('model'), 'qwen3-30b-a3b');
  assert.equal(params.get('gpus'), '8');

  // A reload restores the group and the same figures.
  await urlSettled(page);
  await page.reload();
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('expert-parallel').inputValue(), '8');
  assert.equal(await bytesOf(page, 'weights'), weightsEp8);

  // 3 does not divide 8: the message is next to the field, the figures wait for a fix, and the
  // rest of the page keeps answering.
  await typeInto(page, 'expert-parallel', '3');
  assert.equal(await page.getByTestId('expert-parallel-error').textContent(), 'Must divide the data-parallel GPUs (8).');
  assert.equal(await page.getByTestId('expert-parallel').getAttribute('aria-invalid'), 'true');
  assert.equal(await bytesOf(page, 'total'), null);
  assert.match(await page.getByTestId('total').textContent(), /expert parallelism/);
  assert.match(await page.getByTestId('model-notes').textContent(), /grouped experts/);
  await page.waitForFunction(() => new URLSearchParams(location.search).get('ep') === '3');
  // Six GPUs take a group of 3; the figures come back.
  await typeInto(page, 'num-gpus', '6');
  assert.equal(await page.getByTestId('expert-parallel-error').textContent(), '');
  assert.ok((await bytesOf(page, 'total')) > 0n);
  await typeInto(page, 'num-gpus', '8');
  assert.equal(await page.getByTestId('expert-parallel-error').textContent(), 'Must divide the data-parallel GPUs (8).');
  await typeInto(page, 'expert-parallel', '4');
  assert.equal(await page.getByTestId('expert-parallel-error').textContent(), '');
  const weightsEp4 = await bytesOf(page, 'weights');
  assert.ok(weightsEp8 < weightsEp4 && weightsEp4 < weightsEp1, `${weightsEp8} < ${weightsEp4} < ${weightsEp1}`);
  assert.deepEqual(errors, []);
  await context.close();
});
