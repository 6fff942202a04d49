// Fine-tuning as Unsloth does: a person picks the "Unsloth" trainer, Llama 3.1 8B and a 16 GB
// card (Colab's T4), and reads the longest sequence that fits; its defaults (QLoRA r 16 on the
// 7 linears, its kernels, offloaded checkpointing, AdamW 8-bit) show in their fields, each still
// changeable; the host RAM the offloaded layer inputs take shows beside the verdict; the note
// says the kernels are derived from source; and the link restores the page.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, openArchitecturePage, bytesOf, typeInto, urlSettled } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

/** The longest sequence the verdict shows once searched, in tokens. */
async function longestTokens(page) {
  const line = page.getByTestId('longest-seq');
  await line.waitFor();
  return Number(await line.getAttribute('data-tokens'));
}

test('Unsloth, QLoRA on Llama 3.1 8B and a 16 GB card: the longest sequence, and its link', async () => {
  const { page, errors, context } = await openArchitecturePage(env);
  await page.getByTestId('model').selectOption('llama3.1-8b');
  await page.getByTestId('gpu').selectOption('t4');
  await typeInto(page, 'batch', '1');
  await typeInto(page, 'seq', '2048');
  await page.getByTestId('total').waitFor();
  const plain = Number(await bytesOf(page, 'total'));

  await page.getByTestId('trainer').selectOption('unsloth');
  assert.equal(await page.getByTestId('method').inputValue(), 'qlora');
  assert.equal(await page.getByTestId('lora-rank').inputValue(), '16');
  assert.equal(await page.getByTestId('kernels').inputValue(), 'unsloth');
  assert.equal(await page.getByTestId('checkpointing').inputValue(), 'offload');
  assert.equal(await page.getByTestId('optimizer').inputValue(), 'adamw8bit');
  await page.waitForFunction((before) => {
    const el = document.querySelector('[data-testid="total"]');
    return el && Number(el.dataset.bytes) !== before;
  }, plain);
  const unsloth = Number(await bytesOf(page, 'total'));
  assert.ok(unsloth < plain / 2, `Unsloth ${unsloth} against a full fine-tune's ${plain}`);
  assert.match(await page.getByTestId('model-notes').textContent(), /Unsloth's kernels are derived from its source/);
  // 2,048 tokens of 4,096 x 2 bytes in each of the 31 layers but the last, and the staging
  // buffers Unsloth pins at start
  assert.equal(Number(await bytesOf(page, 'host-ram')), 31 * 2048 * 4096 * 2 + 200 * 131072 * 2);

  // the answer a person came for: tens of thousands of tokens on a 16 GB card (Unsloth
  // publishes 40,724 for its December 2024 release at rank 32, on 16 GB)
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  const tokens = await longestTokens(page);
  assert.ok(tokens >= 30_000 && tokens <= 70_000 && tokens % 128 === 0, `${tokens} tokens`);
  const text = await page.getByTestId('longest-seq').textContent();
  assert.ok(text.includes(tokens.toLocaleString('en-US')), text);

  // Unsloth's own defaults are each still changeable; the release its tables measured fits less
  await page.getByTestId('kernels').selectOption('unsloth-2024.12');
  await page.waitForFunction((t) => Number(document.querySelector('[data-testid="longest-seq"]')?.dataset.tokens) < t, tokens);
  await page.getByTestId('kernels').selectOption('unsloth');
  assert.equal(await page.getByTestId('trainer').inputValue(), 'unsloth');
  await page.waitForFunction((t) => Number(document.querySelector('[data-testid="longest-seq"]')?.dataset.tokens) === t, tokens);

  // the link opens the page at that length, every setting restored
  await page.getByTestId('longest-seq-link').click();
  await page.waitForURL((url) => url.searchParams.get('s') === String(tokens));
  await urlSettled(page);
  const link = page.url();
  const again = await context.newPage();
  await again.goto(link);
  await again.getByTestId('total').waitFor();
  assert.equal(await again.getByTestId('seq').inputValue(), String(tokens));
  assert.equal(await again.getByTestId('trainer').inputValue(), 'unsloth');
  assert.equal(await again.getByTestId('kernels').inputValue(), 'unsloth');
  assert.equal(await again.getByTestId('gpu').inputValue(), 't4');
  await again.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  assert.equal(await longestTokens(again), tokens);
  assert.deepEqual(errors, []);
  await context.close();
});

test('Unsloth on a model its kernels do not patch says so next to the estimate', async () => {
  const { page, errors, context } = await openArchitecturePage(env);
  await page.getByTestId('model').selectOption('gpt2');
  await page.getByTestId('trainer').selectOption('unsloth');
  await page.getByText("Unsloth's kernels are modelled for LoRA and QLoRA training").first().waitFor();
  // the rest of the page keeps working: back to PyTorch's kernels, a figure again
  await page.getByTestId('kernels').selectOption('torch');
  await page.getByTestId('total').waitFor();
  assert.deepEqual(errors, []);
  await context.close();
});
