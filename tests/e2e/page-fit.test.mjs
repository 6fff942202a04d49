// The result cards as a newcomer reads them (part of issue 23): a clipped bar of the chart
// says its value and how far it stands above the line, the sweep table fits its card on a
// desktop and scrolls inside it on a phone, and a pipeline stage with one micro-batch in
// flight says so in the singular.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, openPage } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

const LLAMA_8B_ON_A_4090 = '/?m=arch&model=llama3-8b&s=2048&b=8&r=amp-bf16&gpu=rtx4090&oi=fused';

test('a clipped bar shows its value and its distance to the largest peak that fits', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin + LLAMA_8B_ON_A_4090);
  const clipped = page.getByTestId('chart-clipped');
  assert.ok((await clipped.count()) > 0, 'no bar is clipped');
  const line = Number(await page.getByTestId('chart-capacity').getAttribute('data-bytes'));
  const over = page.getByTestId('chart-clipped-over');
  assert.equal(await over.count(), await clipped.count());
  for (let i = 0; i < (await clipped.count()); i++) {
    const bytes = Number(await clipped.nth(i).getAttribute('data-bytes'));
    assert.ok(bytes > 2 * line, `a clipped bar of ${bytes} against the line ${line}`);
    assert.match(await clipped.nth(i).textContent(), /^\u2191\d/);
    assert.equal(Number(await over.nth(i).getAttribute('data-bytes')), bytes - line);
    assert.match(await over.nth(i).textContent(), /^\+\d/);
  }
  assert.deepEqual(errors, []);
  await context.close();
});

test('the sweep table fits its card at 1,024 px and scrolls inside it on a phone', async () => {
  for (const [width, fits] of [[1024, true], [1400, true], [390, false]]) {
    const { page, errors, context } = await openPage(env.browser, env.server.origin + LLAMA_8B_ON_A_4090);
    await page.setViewportSize({ width, height: 900 });
    const box = await page.evaluate(() => {
      const table = document.querySelector('[data-testid="sweep-table"]');
      const scroll = table.closest('.table-scroll');
      const card = table.closest('.card');
      return {
        table: table.getBoundingClientRect().right,
        card: card.getBoundingClientRect().right,
        scrolls: scroll.scrollWidth > scroll.clientWidth + 1,
        scrollRight: scroll.getBoundingClientRect().right,
        page: document.documentElement.scrollWidth,
        viewport: window.innerWidth,
      };
    });
    if (fits) {
      assert.ok(box.table <= box.card, `${width} px: the table ends at ${box.table}, its card at ${box.card}`);
      assert.ok(!box.scrolls, `${width} px: the table scrolls`);
    } else {
      // on a phone: it scrolls inside its card, and the page itself does not
      assert.ok(box.scrolls, `${width} px: no scrolling inside the card`);
      assert.ok(box.scrollRight <= box.card, `${width} px: the scrolling area leaves its card`);
      assert.ok(box.page <= box.viewport + 1, `${width} px: the page is ${box.page} px wide`);
    }
    assert.deepEqual(errors, []);
    await context.close();
  }
});

test('a pipeline stage with one micro-batch in flight says so in the singular', async () => {
  const { page, errors, context } = await openPage(
    env.browser,
    env.server.origin + '/?m=arch&model=llama3.2-1b&s=1024&b=1&gpus=2&pp=2&mb=1&gpu=h100-80&oi=fused',
  );
  const stage = await page.getByTestId('pipeline-stage').textContent();
  assert.doesNotMatch(stage, /\b1 micro-batches/);
  assert.match(stage, /\b1 micro-batch in flight/);
  assert.deepEqual(errors, []);
  await context.close();
});
