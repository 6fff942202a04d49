// The form as a newcomer meets it (issue 23): the essentials always in view, the rest in
// folded sections that say what in them differs from the defaults and open when it matters
// (more than one GPU, a link that changes them), each reachable by keyboard.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, openPage, typeInto } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

/** The controls of the form a person can see (each radio button counts). */
const visibleControls = (page) =>
  page.evaluate(() =>
    [...document.querySelectorAll('form.inputs input, form.inputs select, form.inputs textarea')]
      .filter((el) => el.checkVisibility())
      .map((el) => el.dataset.testid),
  );

async function desktop(url) {
  const opened = await openPage(env.browser, env.server.origin + url);
  await opened.page.setViewportSize({ width: 1400, height: 900 });
  return opened;
}

test('a first visit shows at most 14 controls, in both modes, until a section is opened', async () => {
  const { page, errors, context } = await desktop('/');
  const simple = await visibleControls(page);
  assert.ok(simple.length <= 14, simple.join(' '));
  for (const essential of ['params', 'precision', 'optimizer', 'batch', 'gpu', 'num-gpus']) {
    assert.ok(simple.includes(essential), `${essential} is not in view: ${simple}`);
  }
  for (const fold of ['fold-parallel', 'fold-overheads']) {
    assert.equal(await page.getByTestId(fold).getAttribute('open'), null, fold);
    assert.equal(await page.getByTestId(`${fold}-note`).textContent(), 'defaults');
  }
  await page.getByTestId('mode-arch').check();
  await page.getByTestId('model').waitFor();
  const arch = await visibleControls(page);
  assert.ok(arch.length <= 14, arch.join(' '));
  for (const essential of ['model', 'seq', 'batch', 'recipe', 'optimizer', 'trainer', 'method', 'gpu']) {
    assert.ok(arch.includes(essential), `${essential} is not in view: ${arch}`);
  }
  assert.equal(await page.getByTestId('fold-step').getAttribute('open'), null);
  assert.equal(await page.getByTestId('fold-step-note').textContent(), 'as the trainer sets them');
  // a section opened by a click shows its fields
  await page.getByTestId('fold-step-summary').click();
  assert.ok(await page.getByTestId('checkpointing').isVisible());
  assert.ok((await visibleControls(page)).length > arch.length);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a link that sets tp=2 opens the parallelism section; its note names what changed', async () => {
  const { page, errors, context } = await desktop('/?m=arch&model=llama3-8b&gpu=h100-80&gpus=2&tp=2');
  assert.equal(await page.getByTestId('fold-parallel').getAttribute('open'), '');
  assert.ok(await page.getByTestId('tensor-parallel').isVisible());
  assert.equal(await page.getByTestId('tensor-parallel').inputValue(), '2');
  // a tensor-parallel group shows its own settings; DeepSpeed's buckets wait for ZeRO
  assert.ok(await page.getByTestId('sequence-parallel').isVisible());
  assert.ok(!(await page.getByTestId('reduce-bucket').isVisible()));
  assert.match(await page.getByTestId('fold-parallel-note').textContent(), /Tensor parallelism/);
  // the sections it does not change stay closed
  assert.equal(await page.getByTestId('fold-overheads').getAttribute('open'), null);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a section opens when it comes to matter, and says so in its summary', async () => {
  const { page, errors, context } = await desktop('/?m=arch&model=llama3-8b&gpu=h100-80');
  assert.equal(await page.getByTestId('fold-parallel').getAttribute('open'), null);
  await typeInto(page, 'num-gpus', '8');
  await page.locator('[data-testid="fold-parallel"][open]').waitFor();
  assert.ok(await page.getByTestId('sharding').isVisible());
  // ZeRO shows DeepSpeed's buckets
  await page.getByTestId('sharding').selectOption('zero3');
  assert.ok(await page.getByTestId('prefetch-bucket').isVisible());
  // a link that changes a setting of the step opens its section, which names it
  await page.goto(env.server.origin + '/?m=arch&model=llama3-8b&gpu=h100-80&gc=every:2&margin=20');
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('fold-step').getAttribute('open'), '');
  assert.match(await page.getByTestId('fold-step-note').textContent(), /Activation checkpointing/);
  assert.equal(await page.getByTestId('fold-overheads').getAttribute('open'), '');
  assert.match(await page.getByTestId('fold-overheads-note').textContent(), /Safety margin/);
  assert.deepEqual(errors, []);
  await context.close();
});

test('every folded field is reachable by keyboard', async () => {
  const { page, errors, context } = await desktop('/');
  // from the GPU count, Tab reaches the next section's summary; Enter opens it, and Tab
  // goes on into its first field
  await page.getByTestId('num-gpus').focus();
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.dataset.testid), 'fold-parallel-summary');
  await page.keyboard.press('Enter');
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.dataset.testid), 'sharding');
  assert.deepEqual(errors, []);
  await context.close();
});
