// What to change so that it fits, in a real browser: Llama 3 8B on an RTX 4090 does not fit
// as a full fine-tune; the page lists plans that do, one of them QLoRA; opening a plan's link
// gives a page whose verdict fits at the peak the plan promised. Also the newcomer fixes:
// activation memory 0, the explanations' page, the summary that stays in view
// on a phone, and inference formats and devices.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, bytesOf, typeInto, openPage, urlSettled } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

const LLAMA_4090 = '/?m=arch&model=llama3-8b&gpu=rtx4090&b=1&s=2048';

test('a step that does not fit lists plans that fit; each link opens a page that fits', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin + LLAMA_4090);
  await page.locator('[data-testid="fit-verdict"][data-fits="false"]').waitFor();
  const advice = page.getByTestId('fit-advice');
  await advice.locator('a[href]').first().waitFor();
  const plans = advice.getByTestId('fit-plan');
  const n = await plans.count();
  assert.ok(n >= 3, `only ${n} plans`);
  assert.equal(await advice.locator('a[href]').count(), n);
  const texts = await plans.allTextContents();
  const qlora = texts.findIndex((t) => t.includes('QLoRA'));
  assert.ok(qlora >= 0, texts.join('\n'));
  // the sticky summary offers the way there
  const hrefs = await advice.locator('a[href]').evaluateAll((as) => as.map((a) => a.getAttribute('href')));
  const peaks = await plans.evaluateAll((ls) => ls.map((l) => l.dataset.peakBytes));
  // open the QLoRA plan as a person would: click it
  await advice.locator('a[href]').nth(qlora).click();
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  assert.equal(await page.getByTestId('method').inputValue(), 'qlora');
  assert.equal(String(await bytesOf(page, 'total')), peaks[qlora]);
  // every other plan's link fits too, at its promised peak
  for (const [i, href] of hrefs.entries()) {
    if (i === qlora) continue;
    await page.goto(env.server.origin + '/' + href);
    await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
    assert.equal(String(await bytesOf(page, 'total')), peaks[i], href);
  }
  assert.deepEqual(errors, []);
  await context.close();
});

test('a step that fits shows other plans only on request', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin + '/?m=arch&model=gpt2&b=2&s=512&gpu=h100-80');
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  assert.equal(await page.getByTestId('fit-plan').count(), 0);
  await page.getByTestId('show-plans').check();
  await page.getByTestId('fit-plan').first().waitFor();
  assert.match(await page.getByTestId('fit-plan').first().textContent(), /As it is/);
  await context.close();
});

test('activation memory 0 gives model state only, with a breakdown and a sweep', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin + '/?gpu=none');
  await typeInto(page, 'act-mb', '0');
  await page.waitForFunction(() => document.querySelector('[data-testid="activations"]')?.dataset.bytes === '0');
  assert.equal(await page.locator('.field.invalid').count(), 0);
  assert.equal(await bytesOf(page, 'total'), 98_000_000_000n);
  assert.equal(await page.getByTestId('sweep-row').count(), 7);
  await context.close();
});

test('"How it works" opens from the footer, offline-ready static text, and leads back', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin + '/?gpu=none');
  // a person clicks the footer's link: the explanations are a page of their own
  await page.getByTestId('about-link').click();
  await page.getByTestId('explanations').waitFor();
  assert.match(page.url(), /\/about\/index\.html$/);
  for (const part of ['how-simple', 'how-architecture', 'how-serving']) {
    assert.ok(await page.getByTestId(part).isVisible(), part);
  }
  // its FAQ opens by keyboard or click, without a script
  assert.equal(await page.locator('script').count(), 0);
  const faq = page.locator('details').first();
  await faq.locator('summary').click();
  assert.equal(await faq.getAttribute('open'), '');
  // and it leads back to the estimator
  await page.getByTestId('back-to-estimator').click();
  await page.getByTestId('total').waitFor({ state: 'attached' });
  assert.deepEqual(errors, []);
  await context.close();
});

test('on a phone the peak and the verdict stay in view below the fold', async () => {
  const context = await env.browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true });
  const page = await context.newPage();
  await page.goto(env.server.origin + LLAMA_4090);
  await page.getByTestId('total').waitFor({ state: 'attached' });
  // nothing widens the page past the phone's width
  assert.equal(await page.evaluate(() => document.documentElement.scrollWidth), 390);
  await page.getByTestId('global-batch').scrollIntoViewIfNeeded();
  const summary = page.getByTestId('sticky-summary');
  assert.ok(await summary.isVisible());
  const box = await summary.boundingBox();
  assert.ok(box && box.y >= -1 && box.y < 10, JSON.stringify(box));
  assert.match(await summary.textContent(), /Peak .* Does not fit/);
  await context.close();
});

test('inference in 4-bit GGUF on a Mac and on the CPU RAM', async () => {
  const base = '/?m=arch&model=llama3-8b&o=none&r=bf16&b=1&s=1024&gen=1024';
  const { page, context } = await openPage(env.browser, env.server.origin + base + '&gpu=mac-16');
  const bf16 = await bytesOf(page, 'weights');
  await page.getByTestId('weight-format').selectOption('q4_k_m');
  await page.waitForFunction((b) => BigInt(document.querySelector('[data-testid="weights"]').dataset.bytes) < b / 3n, bf16);
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  // a Mac has no CUDA context
  assert.equal(await bytesOf(page, 'need-context'), 0n);
  await page.getByTestId('gpu').selectOption('cpu');
  await page.getByTestId('ram-gib').waitFor();
  await typeInto(page, 'ram-gib', '4');
  await page.locator('[data-testid="fit-verdict"][data-fits="false"]').waitFor();
  await urlSettled(page);
  await page.reload();
  assert.equal(await page.getByTestId('ram-gib').inputValue(), '4');
  assert.equal(await page.getByTestId('weight-format').inputValue(), 'q4_k_m');
  await context.close();
});

test('the plans on the GPU the person has come first, under a heading that names it', async () => {
  // the case: Llama 3 8B, a full fine-tune (HF Trainer's defaults), one RTX 4090
  const { page, errors, context } = await openPage(env.browser, env.server.origin + '/?m=arch&model=llama3-8b&gpu=rtx4090');
  await page.locator('[data-testid="fit-verdict"][data-fits="false"]').waitFor();
  const advice = page.getByTestId('fit-advice');
  await advice.getByTestId('fit-plan').first().waitFor();
  const groups = advice.getByTestId('plan-group');
  assert.equal(await groups.first().textContent(), 'On your RTX 4090');
  assert.equal(await groups.first().getAttribute('data-more-gpus'), '0');
  const plans = advice.getByTestId('fit-plan');
  assert.equal(await plans.first().getAttribute('data-gpus'), '1');
  // the plans that need more GPUs come after, grouped, each titled with its GPU count
  assert.equal(await groups.count(), 2);
  assert.equal(await groups.nth(1).textContent(), 'On more GPUs');
  const gpus = await plans.evaluateAll((ls) => ls.map((l) => Number(l.dataset.gpus)));
  const firstMore = gpus.findIndex((g) => g > 1);
  assert.ok(firstMore > 0, String(gpus));
  assert.ok(gpus.slice(firstMore).every((g) => g > 1), String(gpus));
  for (const [i, g] of gpus.entries()) {
    const title = await plans.nth(i).locator('a').textContent();
    if (i >= firstMore) assert.match(title, new RegExp(`^${g} GPUs: `));
    else assert.doesNotMatch(title, /GPUs: /);
  }
  // the link of the first plan opens a one-GPU page that fits
  await plans.first().locator('a').click();
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  assert.equal(await page.getByTestId('num-gpus').inputValue(), '1');
  assert.deepEqual(errors, []);
  await context.close();
});

/** The plans' links and promised peaks, in order, once they are those of sequence `seq`. */
async function plansFor(page, seq) {
  await page.waitForFunction(
    (seq) => document.querySelector('[data-testid="fit-advice"] a[href]')?.getAttribute('href').includes(`s=${seq}&`),
    seq,
  );
  return page.getByTestId('fit-plan').evaluateAll((ls) =>
    ls.map((l) => `${l.querySelector('a').getAttribute('href')} ${l.dataset.peakBytes}`),
  );
}

test('the advisor searches in its worker while typing pauses; without workers the page searches itself, with the same plans', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin + LLAMA_4090);
  await plansFor(page, '2048');
  // one worker, started by the page's own snippet on the page's compiled module: the module
  // is fetched once
  assert.equal(page.workers().length, 1);
  assert.match(page.workers()[0].url(), /\/snippets\/.*\/worker\.js$/);
  const fetched = await page.workers()[0].evaluate(() => performance.getEntriesByType('resource').map((e) => e.name));
  assert.ok(fetched.some((url) => /batch-size-estimator-\w+\.js$/.test(url)), fetched.join('\n'));
  assert.ok(!fetched.some((url) => url.endsWith('.wasm')), fetched.join('\n'));
  // keystrokes in a burst: the plans follow the last value typed
  await typeInto(page, 'seq', '1536');
  const inWorker = await plansFor(page, '1536');
  assert.ok(inWorker.length >= 3, inWorker.join('\n'));
  // the plans' figures follow the unit: the same plans, in GiB
  await page.getByTestId('unit-gib').check();
  await page.waitForFunction(() => document.querySelector('[data-testid="fit-plan"] .plan-figures')?.textContent.includes('GiB'));
  const inGib = await page.getByTestId('fit-plan').evaluateAll((ls) =>
    ls.map((l) => `${l.querySelector('a').getAttribute('href')} ${l.dataset.peakBytes}`),
  );
  assert.deepEqual(inGib.map((p) => p.replace('&u=gib&', '&u=gb&')), inWorker);
  await page.getByTestId('unit-gb').check();
  await page.waitForFunction(() => document.querySelector('[data-testid="fit-plan"] .plan-figures')?.textContent.includes(' GB'));
  assert.deepEqual(errors, []);
  await context.close();

  // a browser that starts no worker, and a worker that fails: the same plans, searched by
  // the page
  const noWorker = () => {
    window.Worker = undefined;
  };
  const failingWorker = () => {
    window.Worker = class {
      constructor() {
        setTimeout(() => this.onerror?.(new Event('error')), 0);
      }
      postMessage() {}
    };
  };
  for (const script of [noWorker, failingWorker]) {
    const bare = await env.browser.newContext();
    await bare.addInitScript(script);
    const page2 = await bare.newPage();
    const errors2 = [];
    page2.on('pageerror', (e) => errors2.push(String(e)));
    await page2.goto(env.server.origin + LLAMA_4090.replace('s=2048', 's=1536'));
    assert.deepEqual(await plansFor(page2, '1536'), inWorker, script.name);
    assert.equal(page2.workers().length, 0);
    // and the next change too
    await typeInto(page2, 'seq', '1024');
    assert.ok((await plansFor(page2, '1024')).length >= 3, script.name);
    assert.deepEqual(errors2, [], script.name);
    await bare.close();
  }
});

test('a search that fails in the worker says so in the card and the page keeps working; the next change gets a fresh worker', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin + LLAMA_4090);
  await plansFor(page, '2048');
  // the worker's next answer fails as a trap would: its first postMessage throws
  await page.workers()[0].evaluate(() => {
    const post = self.postMessage.bind(self);
    let calls = 0;
    self.postMessage = (message) => {
      calls += 1;
      if (calls === 1) throw new Error('a trap, as a panic would be');
      post(message);
    };
  });
  await typeInto(page, 'seq', '1536');
  const advice = page.getByTestId('fit-advice');
  await advice.getByText('The advisor stopped on these inputs', { exact: false }).waitFor();
  assert.equal(await advice.locator('a[href]').count(), 0);
  // the figures still follow the inputs
  await page.waitForFunction(() => new URL(document.querySelector('[data-testid="share-link"]').href).search.includes('s=1536'));
  await page.waitForFunction(() => document.querySelector('[data-testid="fit-verdict"]')?.dataset.fits === 'false');
  // the next change is searched by a fresh worker
  await typeInto(page, 'seq', '1024');
  assert.ok((await plansFor(page, '1024')).length >= 3);
  assert.equal(page.workers().length, 1);
  assert.deepEqual(errors, []);
  await context.close();
});
