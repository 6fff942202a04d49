// DPO and GRPO (TRL 1.16) in a real browser, as a person plans them: DPO on an 8B preset with
// LoRA on a 24 GB GPU, GRPO on a 1.7B preset with 8 generations on one 80 GB GPU. Each phase
// of the step is shown, the one that sets the peak marked; the link carries every setting and
// opening it again gives the same page.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, bytesOf, typeInto, openArchitecturePage, urlSettled, openPage } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

/** The phases the page shows: name -> bytes, and the one in bold (the peak's). */
async function phases(page) {
  return page.getByTestId('step-phases').evaluate((el) => {
    const out = {};
    let peak = null;
    for (const p of el.querySelectorAll('[data-testid^="phase-"]')) {
      const name = p.dataset.testid.slice('phase-'.length);
      out[name] = BigInt(p.dataset.bytes);
      if (p.tagName === 'STRONG') peak = name;
    }
    return { out, peak };
  });
}

/** Opens `url` in a fresh page and returns the figures a person reads. */
async function reopened(url) {
  const { page, errors, context } = await openPage(env.browser, url);
  await page.getByTestId('step-phases').waitFor();
  const figures = {
    peak: await bytesOf(page, 'total'),
    fits: await page.getByTestId('fit-verdict').getAttribute('data-fits'),
  };
  return { page, errors, context, figures };
}

test('DPO on Llama 3 8B with LoRA fits a 24 GB GPU, and the link opens the same plan', async () => {
  const { page, errors, context } = await openArchitecturePage(env, '?gpu=rtx4090');
  await page.getByTestId('model').selectOption('llama3-8b');
  await page.getByTestId('recipe').selectOption('bf16');
  await page.getByTestId('method').selectOption('lora');
  await page.getByTestId('trainer').selectOption('trl-dpo');
  // TRL's defaults: the objective, and with LoRA the base with its adapters off as reference
  assert.equal(await page.getByTestId('objective').inputValue(), 'dpo');
  assert.equal(await page.getByTestId('reference').inputValue(), 'adapters-off');
  // the sequence is the prompt and the completion
  assert.ok(await page.getByTestId('seq').isHidden());
  await typeInto(page, 'max-prompt', '256');
  await typeInto(page, 'max-completion', '256');
  await typeInto(page, 'batch', '1');
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  const shown = await phases(page);
  assert.deepEqual(Object.keys(shown.out), ['training']);
  assert.equal(shown.peak, 'training');
  const peak = await bytesOf(page, 'total');
  assert.equal(shown.out.training, peak);
  // a separate copy of the 8B weights does not fit beside it
  await page.getByTestId('reference').selectOption('separate');
  await page.locator('[data-testid="fit-verdict"][data-fits="false"]').waitFor();
  await page.getByTestId('reference').selectOption('adapters-off');
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();

  await urlSettled(page);
  const url = page.url();
  for (const part of ['obj=dpo', 'ref=adapters-off', 'mp=256', 'mc=256', 'method=lora']) {
    assert.ok(url.includes(part), `${part} in ${url}`);
  }
  const again = await reopened(url);
  assert.deepEqual(again.figures, { peak, fits: 'true' });
  assert.equal(await again.page.getByTestId('reference').inputValue(), 'adapters-off');
  assert.equal(await again.page.getByTestId('max-completion').inputValue(), '256');
  assert.deepEqual(again.errors, []);
  await again.context.close();
  assert.deepEqual(errors, []);
  await context.close();
});

test('GRPO on Qwen3 1.7B with 8 generations on one 80 GB GPU: generation, training, vLLM', async () => {
  const { page, errors, context } = await openArchitecturePage(env, '?gpu=h100-80');
  await page.getByTestId('model').selectOption('qwen3-1.7b');
  await page.getByTestId('recipe').selectOption('bf16');
  await page.getByTestId('trainer').selectOption('trl-grpo');
  assert.equal(await page.getByTestId('objective').inputValue(), 'grpo');
  assert.equal(await page.getByTestId('reference').inputValue(), 'none');
  assert.equal(await page.getByTestId('generations').inputValue(), '8');
  await typeInto(page, 'batch', '1');
  await typeInto(page, 'max-prompt', '256');
  await typeInto(page, 'max-completion', '2048');
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  let shown = await phases(page);
  // the model generates: a generation phase, no scoring with beta = 0
  assert.deepEqual(Object.keys(shown.out), ['generation', 'training']);
  assert.ok(shown.out.generation > 3_441_000_000n, 'the generation holds at least the weights');
  assert.equal(await page.getByTestId('kv-cache').count(), shown.peak === 'generation' ? 1 : 0);

  // more generations per prompt: a larger cache, a larger generation phase
  await typeInto(page, 'generations', '16');
  await page.waitForFunction(
    (before) => BigInt(document.querySelector('[data-testid="phase-generation"]').dataset.bytes) > before,
    shown.out.generation,
  );

  // colocated vLLM reserves its share of the device, and the old policy is scored
  await page.getByTestId('generator').selectOption('vllm-colocated');
  assert.equal(await page.getByTestId('vllm-memory').inputValue(), '0.3');
  await page.getByTestId('vllm-reservation').waitFor();
  const reserved = await bytesOf(page, 'vllm-reservation');
  assert.ok(reserved > 25_000_000_000n && reserved < 26_000_000_000n, `${reserved}`);
  shown = await phases(page);
  assert.ok('scoring' in shown.out, JSON.stringify(Object.keys(shown.out)));
  // the allocator's reserve grows with the tensors in the allocator, not with vLLM's pool:
  // less than a tenth of what the allocator holds, and its line says so
  const reserve = await bytesOf(page, 'need-reserve');
  const held = (await bytesOf(page, 'need-peak')) - reserved;
  assert.ok(reserve * 10n < held, `${reserve} of ${held}`);
  const reserveRow = page.getByTestId('need-reserve').locator('xpath=..');
  assert.match(await reserveRow.textContent(), /none on memory outside the allocator/);
  // a fraction that is not one is refused next to its field, the rest keeps working
  await typeInto(page, 'vllm-memory', '1.5');
  await page.waitForFunction(() => document.querySelector('[data-testid="vllm-memory-error"]')?.textContent !== '');
  assert.match(await page.getByTestId('vllm-memory-error').textContent(), /Must be below 1/);
  await typeInto(page, 'vllm-memory', '0.4');
  await page.waitForFunction(() => document.querySelector('[data-testid="vllm-memory-error"]')?.textContent === '');

  await urlSettled(page);
  const url = page.url();
  for (const part of ['obj=grpo', 'ng=16', 'mc=2048', 'gtr=vllm-colocated', 'vllm=0.4']) {
    assert.ok(url.includes(part), `${part} in ${url}`);
  }
  const peak = await bytesOf(page, 'total');
  const again = await reopened(url);
  assert.equal(again.figures.peak, peak);
  assert.equal(await again.page.getByTestId('generator').inputValue(), 'vllm-colocated');
  assert.equal(await bytesOf(again.page, 'vllm-reservation'), (await bytesOf(page, 'vllm-reservation')));
  assert.deepEqual(again.errors, []);
  await again.context.close();
  assert.deepEqual(errors, []);
  await context.close();
});
