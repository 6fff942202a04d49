// What the GPU really holds (issue 22), driven as a person would: HF Trainer's fused AdamW on
// a first visit, the optimizer kernel and selective checkpointing in the URL, and the
// caching allocator's reserve beside the allocated peak.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, bytesOf, changedBytes, typeInto, openPage, urlSettled, choose } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

/** Waits until the figure `testid` carries bytes other than `before`, and returns them. */
const changed = async (page, testid, before) => Number(await changedBytes(page, testid, before));

test("Llama 3 8B under HF Trainer: fused AdamW leaves the optimizer step's temporary out", async () => {
  // a first visit: no link, no stored state
  const { page, errors, context } = await openPage(env.browser, env.server.origin + '/');
  await page.getByTestId('mode-arch').check();
  await page.getByTestId('model').selectOption('llama3-8b');
  await typeInto(page, 'seq', '512');
  await typeInto(page, 'batch', '1');
  await page.getByTestId('recipe').selectOption('bf16');
  assert.equal(await page.getByTestId('optimizer-impl').inputValue(), 'fused');
  assert.equal(await page.getByTestId('trainer').inputValue(), 'hf');
  const fused = Number(await bytesOf(page, 'total'));
  assert.match(await page.getByTestId('peak-phase').textContent(), /backward/i);

  await choose(page, 'optimizer-impl', 'foreach');
  const foreach = await changed(page, 'total', fused);
  // foreach AdamW's parameter-sized bf16 temporary (16 GB) sets the peak in the step
  assert.ok(foreach > fused * 1.2, `foreach ${foreach} against fused ${fused}`);
  assert.match(await page.getByTestId('peak-phase').textContent(), /optimizer/i);
  assert.equal(await page.getByTestId('trainer').inputValue(), 'custom');

  await urlSettled(page);
  assert.equal(new URL(page.url()).searchParams.get('oi'), 'foreach');
  await page.reload();
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('optimizer-impl').inputValue(), 'foreach');
  assert.equal(Number(await bytesOf(page, 'total')), foreach);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a link from before the optimizer kernel keeps torch.optim\'s foreach', async () => {
  const { page, errors, context } = await openPage(
    env.browser,
    env.server.origin + '/?m=arch&model=llama3.2-1b&b=2&s=1024&r=bf16&o=adamw&gpu=none',
  );
  assert.equal(await page.getByTestId('optimizer-impl').inputValue(), 'foreach');
  assert.deepEqual(errors, []);
  await context.close();
});

test('selective checkpointing lies between none and every layer, and travels in the link', async () => {
  const base = '/?m=arch&model=qwen3-0.6b&b=4&s=2048&r=bf16&gpu=none&oi=fused';
  const { page, errors, context } = await openPage(env.browser, env.server.origin + base + '&gc=none');
  const none = Number(await bytesOf(page, 'total'));
  await choose(page, 'checkpointing', 'full');
  const full = await changed(page, 'total', none);
  await choose(page, 'checkpointing', 'every:2');
  const every2 = await changed(page, 'total', full);
  await choose(page, 'checkpointing', 'ops');
  const ops = await changed(page, 'total', every2);
  assert.ok(full < ops && ops < every2 && every2 < none, `${full} ${ops} ${every2} ${none}`);
  // measured with torchtitan's per-op policy under fake tensors: 23,292,992,512 bytes (foreach)
  await urlSettled(page);
  assert.equal(new URL(page.url()).searchParams.get('gc'), 'ops');
  const again = await openPage(env.browser, page.url());
  assert.equal(await again.page.getByTestId('checkpointing').inputValue(), 'ops');
  assert.equal(Number(await bytesOf(again.page, 'total')), ops);
  assert.deepEqual(errors, []);
  assert.deepEqual(again.errors, []);
  await again.context.close();
  await context.close();
});

test('torch.compile keeps less for backward, per layer (the loss compiled or eager) or whole model, and travels in the link', async () => {
  const base = '/?m=arch&model=llama3.2-1b&b=1&s=2048&r=bf16&gpu=none&oi=fused';
  const { page, errors, context } = await openPage(env.browser, env.server.origin + base);
  const eager = Number(await bytesOf(page, 'total'));
  await choose(page, 'compile', 'layers');
  const layers = await changed(page, 'total', eager);
  assert.ok(layers < eager, `compiled ${layers} against eager ${eager}`);
  await choose(page, 'compile', 'model');
  const model = await changed(page, 'total', layers);
  assert.ok(model < eager, `${model}`);
  await urlSettled(page);
  assert.equal(new URL(page.url()).searchParams.get('comp'), 'model');
  // the blocks compiled and the loss eager (torchtitan before 2025-04): between the two
  await choose(page, 'compile', 'blocks');
  const blocks = await changed(page, 'total', model);
  assert.ok(layers < blocks && blocks < eager, `${blocks}`);
  await urlSettled(page);
  assert.equal(new URL(page.url()).searchParams.get('comp'), 'blocks');
  assert.deepEqual(errors, []);
  await context.close();
});

test("the caching allocator's reserve sits beside the peak, and expandable segments change it", async () => {
  const base = '/?m=arch&model=llama3.2-1b&b=8&s=4096&r=bf16&gc=full&gpu=h100-80&oi=foreach';
  const { page, errors, context } = await openPage(env.browser, env.server.origin + base);
  const peak = Number(await bytesOf(page, 'total'));
  const reserved = Number(await bytesOf(page, 'reserved'));
  assert.ok(reserved > peak, `reserved ${reserved} against allocated ${peak}`);
  // the verdict adds exactly the replay's reserve to the peak
  const reserve = Number(await bytesOf(page, 'need-reserve'));
  assert.equal(Number(await bytesOf(page, 'need-peak')) + reserve, reserved);

  await choose(page, 'allocator', 'expandable');
  // (here more: with room on the GPU the growing segment keeps the hole the freed fp32 logits
  // leave; near the capacity it unmaps it: core's evaluate tests)
  const expandable = await changed(page, 'reserved', reserved);
  assert.ok(expandable !== reserved && expandable > peak, `${expandable}`);
  assert.equal(Number(await bytesOf(page, 'total')), peak);

  // a typed percentage overrides the replay
  await typeInto(page, 'allocator-reserve', '10');
  const typed = await changed(page, 'reserved', expandable);
  assert.equal(typed, peak + Math.floor(peak / 10));
  await typeInto(page, 'allocator-reserve', '');
  assert.equal(await changed(page, 'reserved', typed), expandable);
  await urlSettled(page);
  assert.equal(new URL(page.url()).searchParams.get('alloc'), 'expandable');
  assert.deepEqual(errors, []);
  await context.close();
});
