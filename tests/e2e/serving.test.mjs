// Serving with vLLM as a person asks it: Llama 3.1 8B on an H100, how many tokens of KV cache
// and how many requests of 8k tokens; a link and a reload keep it; a bad value gets its
// message; when one request does not fit, the changes that let vLLM start are links.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import {
  useServerAndBrowser, openArchitecturePage, openPage, typeInto, choose, urlSettled, bytesOf, fixture,
} from './harness.mjs';

const env = useServerAndBrowser({ before, after });
const clipboard = ['clipboard-read', 'clipboard-write'];

async function figure(page, testid) {
  const el = page.getByTestId(testid);
  await el.waitFor();
  return Number(await el.getAttribute('data-value'));
}

test('Llama 3.1 8B on an H100: the KV tokens and the concurrency at 8k, kept by a link and a reload', async () => {
  const { page, errors, context } = await openArchitecturePage(env, '?gpu=h100-80');
  await context.grantPermissions(clipboard, { origin: env.server.origin });
  await choose(page, 'model', 'llama3.1-8b');
  await choose(page, 'optimizer', 'none');
  await choose(page, 'serve', 'on');
  await page.getByTestId('serve-settings').waitFor();
  await typeInto(page, 'max-model-len', '8192');
  await page.locator('[data-testid="serving-card"]').getByText('requests of 8,192 tokens').waitFor();

  const tokens = await figure(page, 'serve-kv-tokens');
  const hundredths = await figure(page, 'serve-concurrency');
  // 80 GB, 90% of it, less 15 GiB of weights and the profile: about 400-460 thousand tokens
  // of 128 KiB each, in pages of 16
  assert.ok(tokens > 380_000 && tokens < 470_000, `${tokens}`);
  assert.equal(tokens % 16, 0);
  // exactly what `memest --preset llama3.1-8b --serve vllm --gpu h100-80 --max-model-len 8192`
  // prints (the same core): 420,608 tokens, 51.34x
  assert.equal(tokens, 420_608);
  assert.equal(hundredths, 5134);
  // one group of full attention: the pool's blocks over the 512 pages one request takes
  assert.equal(hundredths, Math.round((tokens / 16 / 512) * 100));
  assert.match(await page.getByTestId('serve-concurrency').textContent(), /^\d+\.\d\dx$/);
  // the longest request is the model's whole context: it fits
  assert.equal(await figure(page, 'serve-longest'), 131072);
  assert.equal(await page.getByTestId('serve-verdict').count(), 0);
  assert.match(await page.getByTestId('serve-weights').textContent(), /14\.99 GiB/);
  // the sweep: the same pool at other lengths, 8,192 among them
  const lengths = await page.locator('[data-testid="serve-sweep"] tr[data-len]')
    .evaluateAll((rows) => rows.map((r) => Number(r.dataset.len)));
  assert.deepEqual(lengths, [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]);

  // the sweep copies as TSV
  await page.getByTestId('copy-serve-tsv').click();
  await page.getByTestId('copy-serve-tsv-status').getByText('Copied').waitFor();
  const text = await page.evaluate(() => navigator.clipboard.readText());
  assert.match(text, /^max_model_len\tmax_concurrency\tstarts\n1024\t/);
  assert.match(text, new RegExp(`\\n8192\\t${Math.floor(hundredths / 100)}\\.\\d\\d\\tyes\\n`));

  // a link carries it
  await urlSettled(page);
  const params = new URL(page.url()).searchParams;
  assert.equal(params.get('srv'), 'on');
  assert.equal(params.get('mml'), '8192');
  const again = await openPage(env.browser, page.url());
  assert.equal(await figure(again.page, 'serve-kv-tokens'), tokens);
  assert.equal(await figure(again.page, 'serve-concurrency'), hundredths);
  await again.context.close();
  // and a reload
  await page.reload();
  assert.equal(await figure(page, 'serve-kv-tokens'), tokens);

  // more of the device, more tokens; an fp8 cache, twice the tokens
  await typeInto(page, 'gpu-memory-utilization', '0.95');
  await page.waitForFunction((t) => Number(document.querySelector('[data-testid="serve-kv-tokens"]')?.dataset.value) > t, tokens);
  const more = await figure(page, 'serve-kv-tokens');
  await choose(page, 'kv-dtype', 'fp8');
  await page.waitForFunction((t) => Number(document.querySelector('[data-testid="serve-kv-tokens"]')?.dataset.value) > t, more);
  const fp8 = await figure(page, 'serve-kv-tokens');
  assert.ok(fp8 >= 2 * more - 16 && fp8 <= 2 * more + 16, `${fp8} vs ${more}`);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a bad value gets its message; a request too long gets the changes that let vLLM start', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin
    + '/?m=arch&model=llama3.1-8b&o=none&gpu=rtx4090&srv=on');
  await page.getByTestId('serving-card').waitFor();

  await typeInto(page, 'gpu-memory-utilization', '1.5');
  assert.match(await page.getByTestId('gpu-memory-utilization-error').textContent(), /At most 1/);
  await typeInto(page, 'gpu-memory-utilization', '0.9');
  await page.getByTestId('serve-kv-tokens').waitFor();

  // the model's own 131,072 tokens do not fit in a 4090's KV cache
  assert.match(await page.getByTestId('serve-verdict').textContent(), /refuses to start/);
  const longest = await figure(page, 'serve-longest');
  assert.ok(longest > 10_000 && longest < 131_072, `${longest}`);
  const advice = page.locator('[data-testid="serve-advice"] a');
  // only what makes 131,072 tokens fit is offered: two GPUs, or a shorter max_model_len
  // (an fp8 cache or checkpoint alone does not reach it on 24 GB)
  const labels = await advice.allTextContents();
  assert.ok(labels.some((l) => /Tensor parallelism .*: 2/.test(l)), labels.join(' | '));
  assert.ok(labels.some((l) => /max_model_len/.test(l)), labels.join(' | '));
  assert.ok(!labels.some((l) => /fp8 KV cache/.test(l)), labels.join(' | '));
  // following one starts vLLM
  await page.locator('[data-testid="serve-advice"] a', { hasText: 'max_model_len' }).click();
  await page.waitForURL(/mml=/);
  await page.getByTestId('serve-kv-tokens').waitFor();
  assert.equal(await page.getByTestId('serve-verdict').count(), 0);
  assert.equal(await figure(page, 'serve-concurrency'), 100);
  assert.deepEqual(errors, []);
  await context.close();
});

test('expert parallelism spreads whole experts over the tensor-parallel GPUs; the communicator shows outside torch', async () => {
  const base = '/?m=arch&model=qwen1.5-moe-a2.7b&o=none&gpu=h100-80&srv=on&tp=8&gpus=8';
  const { page, errors, context } = await openPage(env.browser, env.server.origin + base);
  await page.getByTestId('serve-kv-tokens').waitFor();
  const split = await bytesOf(page, 'serve-weights');
  // torch's NCCL communicator over the NVSwitch, beside the 215 MiB of one GPU
  assert.equal(await bytesOf(page, 'serve-non-torch'), (215n + 534n) << 20n);
  // 60 experts over 8 GPUs: whole ones, 8 on the first ranks, weigh more than 60/8 of each
  await page.goto(env.server.origin + base + '&ep=8');
  await page.getByTestId('serve-kv-tokens').waitFor();
  assert.ok((await bytesOf(page, 'serve-weights')) > split);
  // vLLM's expert parallelism is its tensor-parallel group, nothing else
  await page.goto(env.server.origin + base + '&ep=4');
  assert.match(await page.getByTestId('serve-error').textContent(), /1 \(off\) or 8/);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a linear-attention hybrid (Qwen3-Next) pasted as a config: sized for vLLM, its training refused with why', async () => {
  const config = await readFile(fixture('qwen3-next-80b-a3b-instruct'), 'utf8');
  const { page, errors, context } = await openArchitecturePage(env, '?gpu=h200&tp=2&gpus=2');
  await page.getByTestId('model').selectOption('custom');
  await page.getByTestId('config-json').fill(config);
  // training: the page says why there is no estimate, and the config itself is fine
  await page.getByText(/serving with vLLM only/).first().waitFor();
  assert.equal(await page.getByTestId('config-json-error').textContent(), '');
  await choose(page, 'optimizer', 'none');
  await choose(page, 'serve', 'on');
  // exactly what `memest --config qwen3-next-80b-a3b-instruct.json --serve vllm --gpu h200
  // --tp 2` prints: pages of 544 tokens (a DeltaNet state each), four groups of 12 layers
  assert.equal(await figure(page, 'serve-kv-tokens'), 989_536);
  assert.equal(await figure(page, 'serve-concurrency'), 1501);
  assert.match(await page.getByTestId('serve-weights').textContent(), /74\.28 GiB/);
  assert.equal(await page.getByTestId('serve-verdict').count(), 0);
  // the link keeps the pasted config and the serving
  await page.waitForURL(/srv=on.*cfg=|cfg=.*srv=on/);
  const again = await openPage(env.browser, page.url());
  assert.equal(await figure(again.page, 'serve-kv-tokens'), 989_536);
  await again.context.close();
  assert.deepEqual(errors, []);
  await context.close();
});
