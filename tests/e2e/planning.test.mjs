// Planning for real hardware in a real browser: verdict, largest batch, overheads, several
// GPUs, accumulation, the KV cache and the chart.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, openPage, bytesOf, typeInto, urlSettled, choose } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

test('the largest batch fits and one more does not', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin + '/?p=1&pu=B&a=2000&gpu=a100-80');
  const max = Number(await page.getByTestId('max-batch').getAttribute('data-value'));
  assert.ok(max > 1, `max batch ${max}`);
  await typeInto(page, 'batch', String(max));
  assert.equal(await page.getByTestId('fit-verdict').getAttribute('data-fits'), 'true');
  assert.match(await page.getByTestId('fit-verdict').textContent(), /Fits: .* left/);
  await typeInto(page, 'batch', String(max + 1));
  assert.equal(await page.getByTestId('fit-verdict').getAttribute('data-fits'), 'false');
  assert.match(await page.getByTestId('fit-verdict').textContent(), /Does not fit: .* missing/);
  const fits = await page.getByTestId('sweep-fits').allTextContents();
  assert.ok(fits.includes('yes') && fits.includes('no'), fits.join());
  assert.deepEqual(errors, []);
  await context.close();
});

test('overheads are their own lines and editable', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin + '/?p=1&pu=B&a=100&b=4&gpu=custom&cap=20000');
  assert.equal(await bytesOf(page, 'gpu-capacity-bytes'), 20000n * 1048576n);
  assert.equal(await bytesOf(page, 'need-context'), 500n * 1048576n);
  const peak = await bytesOf(page, 'need-peak');
  assert.equal(await bytesOf(page, 'need-reserve'), (peak * 5n) / 100n);
  assert.equal(await bytesOf(page, 'usable'), (20000n * 1048576n * 95n) / 100n);
  await typeInto(page, 'cuda-context', '1000');
  assert.equal(await bytesOf(page, 'need-context'), 1000n * 1048576n);
  await typeInto(page, 'safety-margin', '0');
  assert.equal(await bytesOf(page, 'usable'), 20000n * 1048576n);
  await typeInto(page, 'safety-margin', '150');
  assert.match(await page.getByTestId('safety-margin-error').textContent(), /Too large/);
  await context.close();
});

test('even batch 1 not fitting is said plainly', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin + '/?m=arch&model=llama3-70b&b=1&s=2048&gpu=h100-80');
  assert.equal(await page.getByTestId('max-batch').getAttribute('data-value'), '0');
  assert.match(await page.getByTestId('max-batch').textContent(), /Even batch 1 does not fit/);
  await context.close();
});

test('sharding lowers per-GPU memory stage by stage, and says it is per GPU', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin + '/?m=arch&model=llama3-8b&b=1&s=2048&gpu=h100-80&n=8');
  const ddp = await bytesOf(page, 'total');
  const peaks = {};
  for (const stage of ['zero1', 'zero2', 'zero3']) {
    await choose(page, 'sharding', stage);
    peaks[stage] = await bytesOf(page, 'total');
    assert.ok(peaks[stage] < ddp, `${stage}: ${peaks[stage]} >= ${ddp}`);
  }
  // ZeRO-2's reduce bucket and its copy come while the activations are alive: either of
  // ZeRO-1 and ZeRO-2 may peak higher, ZeRO-3 below both
  assert.ok(peaks.zero3 < peaks.zero1 && peaks.zero3 < peaks.zero2);
  const last = peaks.zero3;
  assert.match(await page.getByTestId('per-gpu-note').textContent(), /per GPU/);
  await typeInto(page, 'tensor-parallel', '2');
  assert.ok((await bytesOf(page, 'total')) < last);
  await context.close();
});

test('gradient accumulation reaches the global batch with the largest micro-batch', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin + '/?p=1&pu=B&a=2000&gpu=a100-80&n=4');
  await typeInto(page, 'global-batch', '1024');
  const plan = page.getByTestId('accumulation-plan');
  const micro = Number(await plan.getAttribute('data-micro-batch'));
  const steps = Number(await plan.getAttribute('data-steps'));
  const max = Number(await page.getByTestId('max-batch').getAttribute('data-value'));
  assert.ok(micro <= max);
  assert.ok(micro * steps * 4 >= 1024);
  assert.ok((steps - 1) * max * 4 < 1024, 'no fewer steps would do');
  assert.match(await plan.textContent(), /accumulation step/);
  await context.close();
});

test('generation adds a KV cache with grouped-query attention', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin + '/?m=arch&model=llama3-8b&o=none&r=bf16&b=4&s=1024&gpu=none');
  const before = await bytesOf(page, 'total');
  await typeInto(page, 'new-tokens', '1024');
  // 4 x 2048 tokens x 32 layers x K and V x 8 KV heads x 128 x 2 bytes.
  assert.equal(await bytesOf(page, 'kv-cache'), 4n * 2048n * 32n * 2n * 8n * 128n * 2n);
  assert.ok((await bytesOf(page, 'total')) > before);
  await context.close();
});

test('the chart follows the sweep and draws the GPU line', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin + '/?gpu=h200');
  const chart = page.getByTestId('memory-chart');
  assert.equal(await chart.getAttribute('role'), 'img');
  assert.equal(await page.getByTestId('chart-bar').count(), await page.getByTestId('sweep-row').count());
  assert.ok((await bytesOf(page, 'chart-capacity')) > 0n);
  assert.match(await chart.locator('desc').textContent(), /batch 8: 102\.10 GB/);
  await typeInto(page, 'batch', '12');
  assert.equal(await page.getByTestId('chart-bar').count(), 8);
  await page.getByTestId('gpu').selectOption('none');
  assert.equal(await page.getByTestId('chart-capacity').count(), 0);
  await context.close();
});

test('the hardware settings travel in the URL', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin);
  await page.getByTestId('gpu').selectOption('custom');
  await typeInto(page, 'gpu-capacity', '30000');
  await typeInto(page, 'num-gpus', '16');
  await choose(page, 'sharding', 'zero2');
  await typeInto(page, 'global-batch', '512');
  await urlSettled(page);
  const url = page.url();
  const other = await env.browser.newContext();
  const fresh = await other.newPage();
  await fresh.goto(url);
  await fresh.getByTestId('total').waitFor();
  assert.equal(await fresh.getByTestId('gpu').inputValue(), 'custom');
  assert.equal(await fresh.getByTestId('gpu-capacity').inputValue(), '30000');
  assert.equal(await fresh.getByTestId('num-gpus').inputValue(), '16');
  assert.equal(await fresh.getByTestId('sharding').inputValue(), 'zero2');
  assert.equal(await fresh.getByTestId('max-batch').getAttribute('data-value'), await page.getByTestId('max-batch').getAttribute('data-value'));
  await other.close();
  await context.close();
});

test('a batch smaller than the global batch keeps every gradient alive through its passes', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin + '/?m=arch&model=llama3.2-1b&b=1&s=2048&r=bf16&o=adamw&oi=fused&gc=none&gpu=h100-80');
  const alone = await bytesOf(page, 'total');
  assert.equal(await page.getByTestId('accumulation-passes').count(), 0);
  await typeInto(page, 'global-batch', '8');
  const passes = page.getByTestId('accumulation-passes');
  await passes.waitFor();
  assert.equal(await passes.getAttribute('data-passes'), '8');
  assert.match(await passes.textContent(), /every gradient stays alive/);
  // Llama 3.2 1B's bf16 gradients, 1,235,814,400 parameters x 2 bytes (a tied head), join
  // the peak: measured with PyTorch, validation/grid-accumulation.json (+2.47 GB at 2 passes)
  const accumulated = await bytesOf(page, 'total');
  assert.ok(accumulated - alone > 2_400_000_000n && accumulated - alone < 2_520_000_000n, `${accumulated - alone}`);
  await typeInto(page, 'batch', '8');
  assert.equal(await page.getByTestId('accumulation-passes').count(), 0);
  assert.deepEqual(errors, []);
  await context.close();
});
