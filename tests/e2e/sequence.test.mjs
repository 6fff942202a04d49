// The longest sequence that fits, beside the largest batch: Llama 3.1 8B with QLoRA on an
// RTX 4090 (24 GB) shows it in the verdict once the inputs rest; its link opens the page at
// that length (the sequence field and the address bar); the sweep over sequence lengths
// replaces the batch sweep in the table and the chart, copies as a Markdown table, and the
// choice survives a reload and a shared link.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  useServerAndBrowser,
  openArchitecturePage,
  openPage,
  typeInto,
  choose,
  urlSettled,
} from './harness.mjs';

const env = useServerAndBrowser({ before, after });

const clipboard = ['clipboard-read', 'clipboard-write'];

/** Sets up Llama 3.1 8B with QLoRA (the page's adapter defaults) on an RTX 4090, batch 1. */
async function qloraOn4090(page) {
  await page.getByTestId('model').selectOption('llama3.1-8b');
  await typeInto(page, 'seq', '2048');
  await typeInto(page, 'batch', '1');
  await page.getByTestId('recipe').selectOption('amp-bf16');
  await choose(page, 'checkpointing', 'full');
  await page.getByTestId('method').selectOption('qlora');
  await page.getByTestId('optimizer').selectOption('paged-adamw8bit');
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
}

/** The longest sequence the verdict shows, once searched: its tokens and batch. */
async function longestShown(page) {
  const line = page.getByTestId('longest-seq');
  await line.waitFor();
  return {
    tokens: Number(await line.getAttribute('data-tokens')),
    batch: Number(await line.getAttribute('data-batch')),
    text: await line.textContent(),
  };
}

test('Llama 3.1 8B QLoRA on a 24 GB card: the longest sequence, and its link', async () => {
  const { page, errors, context } = await openArchitecturePage(env, '?gpu=rtx4090');
  await qloraOn4090(page);
  const { tokens, batch, text } = await longestShown(page);
  assert.equal(batch, 1);
  // a positive multiple of the 128-token grid, at least the 2,048 that fit, well under what
  // an 80 GB card would hold (the figure moves with the allocator's reserve and the margin)
  assert.ok(tokens >= 2048 && tokens <= 65_536 && tokens % 128 === 0, text);
  assert.match(text, /^Longest sequence that fits at batch 1: [\d,]+ tokens/);
  assert.ok(text.includes(tokens.toLocaleString('en-US')), text);

  // a typed change hides the answer until the search has run for the new inputs
  await typeInto(page, 'batch', '2');
  await page.waitForFunction(() => document.querySelector('[data-testid="longest-seq"]')?.dataset.batch === '2');
  const atTwo = await longestShown(page);
  assert.ok(atTwo.tokens < tokens, `${atTwo.tokens} at batch 2, ${tokens} at batch 1`);
  await typeInto(page, 'batch', '1');
  await page.waitForFunction(() => document.querySelector('[data-testid="longest-seq"]')?.dataset.batch === '1');

  // the link opens the page at that length: the field and the address bar
  await page.getByTestId('longest-seq-link').click();
  await page.waitForURL((url) => url.searchParams.get('s') === String(tokens));
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('seq').inputValue(), String(tokens));
  assert.equal(await page.getByTestId('batch').inputValue(), '1');
  assert.equal(await page.getByTestId('method').inputValue(), 'qlora');
  // and there it fits, the longest the search gives being the same
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  assert.equal((await longestShown(page)).tokens, tokens);
  assert.deepEqual(errors, []);
  await context.close();
});

test('the sweep over sequence lengths: table, chart, Markdown copy, and a reload keeps it', async () => {
  const { page, errors, context } = await openArchitecturePage(env, '?gpu=rtx4090');
  await context.grantPermissions(clipboard, { origin: env.server.origin });
  await qloraOn4090(page);
  const { tokens } = await longestShown(page);
  assert.equal(await page.getByTestId('sweep-title').textContent(), 'Batch Size vs. Memory');

  await page.getByTestId('sweep-axis').selectOption('seq');
  await page.getByTestId('sweep-title').getByText('Sequence Length vs. Memory').waitFor();
  await page.locator('[data-testid="sweep-row"][data-tokens]').first().waitFor();
  const rows = page.getByTestId('sweep-row');
  const lengths = await rows.evaluateAll((rs) => rs.map((r) => Number(r.dataset.tokens)));
  assert.deepEqual(lengths, [256, 512, 1024, 2048, 4096, 8192, 16384]);
  const batches = await rows.evaluateAll((rs) => [...new Set(rs.map((r) => r.dataset.batch))]);
  assert.deepEqual(batches, ['1']);
  const selected = await rows.evaluateAll((rs) => rs.filter((r) => r.classList.contains('selected')).map((r) => r.dataset.tokens));
  assert.deepEqual(selected, ['2048']);
  // a row fits when it is no longer than the longest sequence
  const fits = await rows.evaluateAll((rs) => rs.map((r) => [Number(r.dataset.tokens), r.querySelector('[data-testid="sweep-fits"]').textContent]));
  for (const [length, fit] of fits) assert.equal(fit, length <= tokens ? 'yes' : 'no', `${length} vs ${tokens}`);
  // peaks grow with the length
  const peaks = await rows.evaluateAll((rs) => rs.map((r) => BigInt(r.dataset.totalBytes)));
  for (let i = 1; i < peaks.length; i++) assert.ok(peaks[i] > peaks[i - 1]);
  // the chart draws the same lengths
  const bars = await page.getByTestId('chart-bar').evaluateAll((bs) => bs.map((b) => Number(b.dataset.tokens)));
  assert.deepEqual(bars, lengths);

  await page.getByTestId('copy-sweep').click();
  await page.getByTestId('copy-sweep').getByText('Copied!').waitFor();
  const markdown = await page.evaluate(() => navigator.clipboard.readText());
  const lines = markdown.trim().split('\n');
  assert.match(lines[0], /^\| Sequence Length \(tokens\) \| Weights \+ Grad \+ Opt at peak \(GB\) \|.* \| Fits \|$/);
  assert.match(lines[1], /^\|( ---: \|)+$/);
  assert.equal(lines.length, 2 + lengths.length);
  assert.ok(lines.some((l) => l.startsWith('| **2048** |')), markdown);
  assert.ok(lines.some((l) => l.startsWith('| 16384 |') && l.endsWith('| no |')), markdown);

  // the choice is in the address bar, and a reload keeps it
  await urlSettled(page);
  assert.equal(new URL(page.url()).searchParams.get('sweep'), 'seq');
  await page.reload();
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('sweep-axis').inputValue(), 'seq');
  await page.getByTestId('sweep-title').getByText('Sequence Length vs. Memory').waitFor();
  await page.locator('[data-testid="sweep-row"][data-tokens="2048"]').waitFor();

  // back to the batch sweep: the address bar drops the key
  await page.getByTestId('sweep-axis').selectOption('batch');
  await page.locator('[data-testid="sweep-row"]:not([data-tokens])').first().waitFor();
  await urlSettled(page);
  assert.equal(new URL(page.url()).searchParams.get('sweep'), null);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a shared link with sweep=seq opens the sweep over lengths; the simple mode has none', async () => {
  const query = '?m=arch&model=qwen3-0.6b&s=1024&b=2&r=bf16&gpu=rtx4090&sweep=seq';
  const { page, errors, context } = await openPage(env.browser, env.server.origin + '/' + query);
  await page.locator('[data-testid="sweep-row"][data-tokens="1024"].selected').waitFor();
  assert.equal(await page.getByTestId('sweep-axis').inputValue(), 'seq');
  const { tokens, batch } = await longestShown(page);
  assert.equal(batch, 2);
  assert.ok(tokens > 1024 && tokens % 128 === 0, String(tokens));
  // the simple mode varies the batch only: no control, the batch sweep
  await page.getByTestId('mode-simple').check();
  await page.getByTestId('sweep-axis').waitFor({ state: 'hidden' });
  await page.locator('[data-testid="sweep-row"]:not([data-tokens])').first().waitFor();
  assert.equal(await page.getByTestId('longest-seq').count(), 0);
  assert.deepEqual(errors, []);
  await context.close();
});
