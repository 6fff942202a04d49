// The result cards patched in place (attributes and texts set where only they changed) read
// exactly as the same cards parsed from scratch: after a series of changes, every card is
// the markup a fresh load of the same link shows.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, openPage, typeInto, urlSettled } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

// The longest sequence joins the verdict once the inputs rest (40 ms): wait for it where it
// comes (architecture mode on a GPU, as every link below), so that both pages are settled.
const searched = (page) =>
  page.waitForFunction(
    () => {
      // (the axis is offered, in its card, only where lengths are searched)
      const axis = document.querySelector('[data-testid="sweep-axis"]');
      return !axis?.checkVisibility() || document.querySelector('[data-testid="longest-seq"]');
    },
  );

const cards = async (page) =>
  (await searched(page)) &&
  page.evaluate(() =>
    [
      '[data-testid="memory-chart"]',
      '[data-testid="breakdown-bar"]',
      'dl.parts',
      '.verdict-card [aria-live]',
      '[data-testid="sweep-table"] tbody',
    ].map((selector) =>
      // (Leptos' marker of where the first render ended goes with the first rewrite)
      (document.querySelector(selector)?.innerHTML ?? `no ${selector}`).replaceAll('<!---->', ''),
    ),
  );

for (const [name, query, field, values] of [
  ['architecture', '/?m=arch&model=llama3-8b&s=2048&gpu=h100-80&n=8&shard=zero2', 'batch', ['3', '5', '31', '33', '64', '7']],
  ['simple', '/?gpu=h100-80', 'batch', ['3', '9', '16', '17', '2']],
  ['architecture, sequence', '/?m=arch&model=llama3.2-1b&gpu=rtx4090&b=4', 'seq', ['1024', '3000', '512', '4096']],
]) {
  test(`patched cards equal a fresh load (${name})`, async () => {
    const { page, errors, context } = await openPage(env.browser, env.server.origin + query);
    for (const value of values) await typeInto(page, field, value);
    await urlSettled(page);
    const patched = await cards(page);
    const url = page.url();
    const fresh = await openPage(env.browser, url);
    assert.deepEqual(patched, await cards(fresh.page));
    assert.deepEqual(errors, []);
    await fresh.context.close();
    await context.close();
  });
}
