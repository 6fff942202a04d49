// Parameter-efficient fine-tuning in a real browser: QLoRA on an 8B model fits a 24 GB GPU at
// the batch the page computes (and not one more), the trainable parameters and the paged
// optimizer state are shown, every PEFT setting travels in the URL and survives a reload,
// a base loaded in fp32 is set, shared and restored, and a module name the model does not
// have is refused next to its field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  useServerAndBrowser,
  bytesOf,
  changedBytes,
  typeInto,
  openArchitecturePage,
  openPage,
  urlSettled,
  choose,
} from './harness.mjs';

const env = useServerAndBrowser({ before, after });

test('QLoRA on Llama 3 8B fits a 24 GB GPU at the largest batch the page gives, not one more', async () => {
  const { page, errors, context } = await openArchitecturePage(env, '?gpu=rtx4090');
  await page.getByTestId('model').selectOption('llama3-8b');
  await typeInto(page, 'seq', '2048');
  await typeInto(page, 'batch', '1');
  await page.getByTestId('recipe').selectOption('amp-bf16');
  await choose(page, 'checkpointing', 'full');
  // full fine-tuning of an 8B model is far from fitting one 24 GB card
  await page.locator('[data-testid="fit-verdict"][data-fits="false"]').waitFor();

  await page.getByTestId('method').selectOption('qlora');
  await page.getByTestId('optimizer').selectOption('paged-adamw8bit');
  assert.equal(await page.getByTestId('lora-rank').inputValue(), '16');
  assert.equal(await page.getByTestId('lora-targets').inputValue(), 'all-linear');
  assert.equal(await page.getByTestId('quant').inputValue(), 'nf4');
  assert.equal(await page.getByTestId('double-quant').inputValue(), 'on');
  assert.equal(await page.getByTestId('kbit-prepare').inputValue(), 'on');
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  const trainable = page.getByTestId('trainable-params');
  assert.equal(await trainable.getAttribute('data-value'), '41943040');
  assert.equal(await trainable.textContent(), '(41,943,040 trainable)');
  assert.equal(await page.getByTestId('n-params').getAttribute('data-value'), String(8_030_261_248 + 41_943_040));
  // the paged AdamW state is a line of its own and part of the peak
  assert.equal(await bytesOf(page, 'paged-optimizer-states'), 44_040_192n);
  assert.match(await page.getByTestId('paged-optimizer-states').locator('..').textContent(), /outside PyTorch/);

  const max = Number(await page.getByTestId('max-batch').getAttribute('data-value'));
  assert.ok(max >= 1 && max <= 8, `largest batch ${max}`);
  await typeInto(page, 'batch', String(max));
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  await typeInto(page, 'batch', String(max + 1));
  await page.locator('[data-testid="fit-verdict"][data-fits="false"]').waitFor();
  assert.deepEqual(errors, []);
  await context.close();
});

test('every PEFT setting travels in the URL and comes back on reload', async () => {
  const query =
    '?m=arch&model=qwen3-8b&s=1024&b=2&gpu=none&o=adamw8bit&gc=offload&method=qlora&lr=64&la=128' +
    '&ld=0.05&lt=q_proj,v_proj&ldt=model&q=fp4&dq=off&kbit=off';
  const { page, errors, context } = await openArchitecturePage(env, query);
  const expected = {
    method: 'qlora',
    optimizer: 'adamw8bit',
    checkpointing: 'offload',
    'lora-rank': '64',
    'lora-alpha': '128',
    'lora-dropout': '0.05',
    'lora-targets': 'q_proj,v_proj',
    'lora-dtype': 'model',
    quant: 'fp4',
    'double-quant': 'off',
    'kbit-prepare': 'off',
  };
  for (const [testid, value] of Object.entries(expected)) {
    assert.equal(await page.getByTestId(testid).inputValue(), value, testid);
  }
  // r 64 on q and v of 36 layers: 64 x (4096 + 4096) + 64 x (4096 + 1024) per layer
  assert.equal(await page.getByTestId('trainable-params').getAttribute('data-value'), String(36 * 64 * (8192 + 5120)));
  const peak = await bytesOf(page, 'total');
  assert.ok(peak > 0n);

  // Change settings as a person does; the URL follows and a reload restores them.
  await typeInto(page, 'lora-rank', '8');
  await typeInto(page, 'lora-targets', 'all-linear');
  await page.getByTestId('double-quant').selectOption('on');
  await page.getByTestId('lora-dtype').selectOption('fp32');
  await page.waitForFunction(() => {
    const p = new URLSearchParams(location.search);
    return p.get('lr') === '8' && p.get('lt') === 'all-linear' && p.get('dq') === 'on' && p.get('ldt') === 'fp32';
  });
  const changed = await bytesOf(page, 'total');
  assert.notEqual(changed, peak);
  await urlSettled(page);
  await page.reload();
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('lora-rank').inputValue(), '8');
  assert.equal(await page.getByTestId('quant').inputValue(), 'fp4');
  assert.equal(await page.getByTestId('kbit-prepare').inputValue(), 'off');
  assert.equal(await bytesOf(page, 'total'), changed);

  // Full fine-tuning hides the adapter settings and trains every parameter.
  await page.getByTestId('method').selectOption('full');
  assert.equal(await page.getByTestId('peft-settings').isVisible(), false);
  assert.equal(await page.getByTestId('trainable-params').count(), 0);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a LoRA base loaded in fp32 runs the step in fp32, travels in the link and comes back', async () => {
  const query = '?m=arch&model=llama3.2-1b&s=512&b=1&gpu=none&r=bf16&o=adamw&gc=full&method=lora';
  const { page, errors, context } = await openArchitecturePage(env, query);
  assert.equal(await page.getByTestId('base-dtype').inputValue(), 'recipe');
  const bf16 = await bytesOf(page, 'total');
  // the same step under the fp32 recipe: what an fp32 base runs when nothing casts it
  await page.getByTestId('recipe').selectOption('fp32');
  const fp32 = await changedBytes(page, 'total', bf16);
  await page.getByTestId('recipe').selectOption('bf16');
  await changedBytes(page, 'total', fp32);

  await page.getByTestId('base-dtype').selectOption('fp32');
  assert.equal(await changedBytes(page, 'total', bf16), fp32);
  await page.waitForFunction(() => new URLSearchParams(location.search).get('bdt') === 'fp32');
  await urlSettled(page);
  const link = await page.getByTestId('share-link').getAttribute('href');
  await page.reload();
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('base-dtype').inputValue(), 'fp32');
  assert.equal(await bytesOf(page, 'total'), fp32);

  // the shared link opens the same step in a fresh page
  const shared = await openPage(env.browser, new URL(link, env.server.origin).href);
  assert.equal(await shared.page.getByTestId('base-dtype').inputValue(), 'fp32');
  assert.equal(await bytesOf(shared.page, 'total'), fp32);
  assert.deepEqual(shared.errors, []);
  await shared.context.close();

  // under AMP the base is fp32 already: the setting changes nothing
  await page.getByTestId('recipe').selectOption('amp-bf16');
  const amp = await changedBytes(page, 'total', fp32);
  await page.getByTestId('base-dtype').selectOption('recipe');
  await page.waitForFunction(() => new URLSearchParams(location.search).get('bdt') === 'recipe');
  assert.equal(await bytesOf(page, 'total'), amp);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a target module the model does not have is refused next to its field', async () => {
  const { page, errors, context } = await openArchitecturePage(env, '?m=arch&model=gpt2&s=1024&gpu=none&method=lora');
  await typeInto(page, 'lora-targets', 'q_proj');
  assert.equal(
    await page.getByTestId('lora-targets-error').textContent(),
    'This model has no module "q_proj" (its linears: c_attn, c_proj, c_fc).',
  );
  assert.equal(await page.getByTestId('lora-targets').getAttribute('aria-invalid'), 'true');
  assert.equal(await bytesOf(page, 'total'), null);
  await typeInto(page, 'lora-targets', 'c_attn');
  assert.equal(await page.getByTestId('lora-targets-error').textContent(), '');
  assert.ok((await bytesOf(page, 'total')) > 0n);
  // GPT-2's attention-only LoRA at r 16: c_attn 16 x (768 + 2304) per layer
  assert.equal(await page.getByTestId('trainable-params').getAttribute('data-value'), String(12 * 16 * (768 + 2304)));
  assert.deepEqual(errors, []);
  await context.close();
});
