// The trainers' losses in a real browser: picking TRL's SFTTrainer on a Qwen3 fine-tune
// brings the step from the logits-bound figure of a plain loop to TRL's own (issue: 5.55 GiB
// measured against 17.7 GiB estimated), the trainer's settings travel in the URL, and a
// changed default shows as a custom setup.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, bytesOf, typeInto, openArchitecturePage, urlSettled, choose, reveal } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

const GIB = 2 ** 30;

test("TRL's SFTTrainer on Qwen3-0.6B needs a third of a plain loop's memory", async () => {
  const { page, errors, context } = await openArchitecturePage(env, '?gpu=none&oi=fused');
  await page.getByTestId('model').selectOption('qwen3-0.6b');
  await typeInto(page, 'seq', '2048');
  await typeInto(page, 'batch', '4');
  await page.getByTestId('recipe').selectOption('bf16');
  await choose(page, 'checkpointing', 'full');
  assert.equal(await page.getByTestId('trainer').inputValue(), 'custom');
  await choose(page, 'checkpointing', 'none');
  assert.equal(await page.getByTestId('trainer').inputValue(), 'hf');
  const plain = Number(await bytesOf(page, 'total'));

  await page.getByTestId('trainer').selectOption('trl-1.13');
  assert.equal(await page.getByTestId('loss').inputValue(), 'trl-chunked');
  assert.equal(await page.getByTestId('checkpointing').inputValue(), 'full');
  await page.waitForFunction((before) => {
    const el = document.querySelector('[data-testid="total"]');
    return el && Number(el.dataset.bytes) !== before;
  }, plain);
  const trl = Number(await bytesOf(page, 'total'));
  // with the fused AdamW TRL inherits from HF Trainer, the peak leaves the optimizer step for
  // the backward, which TRL 1.13's own code peaked at 5.092 GiB (trainers-measured.jsonl, the
  // foreach row's backward: the optimizer kernel does not change it)
  assert.equal(await page.getByTestId('optimizer-impl').inputValue(), 'fused');
  assert.ok(Math.abs(trl / GIB / 5.092 - 1) < 0.01, `TRL SFT: ${trl / GIB} GiB`);
  assert.ok(plain > 2.5 * trl, `plain loop ${plain / GIB} GiB against TRL ${trl / GIB} GiB`);
  // TRL 1.13's own code measured under fake tensors with foreach AdamW: 5.55 GiB (peak in
  // the optimizer step); the changed kernel makes the setup custom
  await choose(page, 'optimizer-impl', 'foreach');
  await page.waitForFunction((before) => {
    const el = document.querySelector('[data-testid="total"]');
    return el && Number(el.dataset.bytes) !== before;
  }, trl);
  const foreach = Number(await bytesOf(page, 'total'));
  assert.ok(Math.abs(foreach / GIB - 5.55) < 0.01, `TRL SFT, foreach: ${foreach / GIB} GiB`);
  assert.equal(await page.getByTestId('trainer').inputValue(), 'custom');
  await choose(page, 'optimizer-impl', 'fused');

  await urlSettled(page);
  const url = new URL(page.url());
  assert.equal(url.searchParams.get('loss'), 'trl-chunked');
  assert.equal(url.searchParams.get('gc'), 'full');
  await page.reload();
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('trainer').inputValue(), 'trl-1.13');
  assert.equal(Number(await bytesOf(page, 'total')), trl);

  // a changed default is no trainer's: the select says so, the figure follows the loss
  await choose(page, 'loss', 'hf');
  assert.equal(await page.getByTestId('trainer').inputValue(), 'custom');
  assert.deepEqual(errors, []);
  await context.close();
});

test("TRL's SFTTrainer on Qwen3-8B: the trainer's defaults give a smaller peak than HF Trainer's", async () => {
  const { page, errors, context } = await openArchitecturePage(env, '?gpu=h100-80');
  await page.getByTestId('model').selectOption('qwen3-8b');
  await typeInto(page, 'seq', '4096');
  // at 8 x 4096 tokens the fp32 logits of HF's loss outweigh the optimizer step
  await typeInto(page, 'batch', '8');
  await page.getByTestId('recipe').selectOption('bf16');
  await page.getByTestId('trainer').selectOption('hf');
  await choose(page, 'checkpointing', 'full');
  const hf = Number(await bytesOf(page, 'total'));
  for (const trainer of ['trl-1.13', 'trl']) {
    await page.getByTestId('trainer').selectOption(trainer);
    await page.waitForFunction((before) => {
      const el = document.querySelector('[data-testid="total"]');
      return el && Number(el.dataset.bytes) < before;
    }, hf);
    assert.equal(await page.getByTestId('checkpointing').inputValue(), 'full');
  }
  assert.equal(await page.getByTestId('loss').inputValue(), 'trl-fused');
  assert.deepEqual(errors, []);
  await context.close();
});

test('packing, padding and flash_attention_2 travel in the URL and change the attention path', async () => {
  const query = '?m=arch&model=llama3.2-1b&s=4096&b=2&r=bf16&gpu=none&pack=on&pad=on&attn=flash2&loss=liger';
  const { page, errors, context } = await openArchitecturePage(env, query);
  assert.equal(await page.getByTestId('packing').inputValue(), 'on');
  assert.equal(await page.getByTestId('padding').inputValue(), 'on');
  assert.equal(await page.getByTestId('attention').inputValue(), 'flash2');
  assert.equal(await page.getByTestId('loss').inputValue(), 'liger');
  const flash = Number(await bytesOf(page, 'total'));
  // SDPA with a padded, packed batch builds a 4-D mask per layer and loses the flash kernel
  await choose(page, 'attention', 'sdpa');
  await page.waitForFunction((before) => {
    const el = document.querySelector('[data-testid="total"]');
    return el && Number(el.dataset.bytes) > before;
  }, flash);
  await choose(page, 'padding', 'off');
  await choose(page, 'packing', 'off');
  await page.waitForFunction((before) => {
    const el = document.querySelector('[data-testid="total"]');
    // the same flash kernel without flash-attn's RNG state (one 512-byte block per layer)
    return el && Number(el.dataset.bytes) === before - 16 * 512;
  }, flash);
  assert.deepEqual(errors, []);
  await context.close();
});

test("the optimizer kernel says it means nothing for an optimizer that runs its own", async () => {
  const { page, errors, context } = await openArchitecturePage(env, '?gpu=none&oi=fused');
  await page.getByTestId('model').selectOption('llama3.2-1b');
  await reveal(page, 'optimizer-impl');
  const select = page.getByTestId('optimizer-impl');
  const note = page.getByTestId('optimizer-impl-note');
  assert.equal(await select.isEnabled(), true);
  assert.equal(await note.textContent(), '');
  // bitsandbytes steps each parameter with its own 8-bit kernel: the choice is kept, but
  // disabled, and the figure is the same whatever it is
  await page.getByTestId('optimizer').selectOption('adamw8bit');
  await page.waitForFunction(() => document.querySelector('[data-testid="optimizer-impl"]').disabled);
  assert.match(await note.textContent(), /^No effect: bitsandbytes steps each parameter with its own 8-bit kernel/);
  assert.equal(await select.getAttribute('aria-describedby'), 'optimizer-impl-note');
  const fused = await bytesOf(page, 'total');
  await urlSettled(page);
  const url = new URL(page.url());
  assert.equal(url.searchParams.get('o'), 'adamw8bit');
  url.searchParams.set('oi', 'forloop');
  await page.goto(url.toString());
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('optimizer-impl').inputValue(), 'forloop');
  assert.equal(await page.getByTestId('optimizer-impl').isDisabled(), true);
  assert.equal(await bytesOf(page, 'total'), fused);
  // Adafactor is estimated one tensor at a time; AdamW takes the choice again
  await page.getByTestId('optimizer').selectOption('adafactor');
  await page.waitForFunction(() =>
    document.querySelector('[data-testid="optimizer-impl-note"]').textContent.includes('foreach=None'));
  await page.getByTestId('optimizer').selectOption('adamw');
  await page.waitForFunction(() => !document.querySelector('[data-testid="optimizer-impl"]').disabled);
  assert.equal(await page.getByTestId('optimizer-impl-note').textContent(), '');
  assert.deepEqual(errors, []);
  await context.close();
});
