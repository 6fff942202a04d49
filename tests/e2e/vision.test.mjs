// Vision-language models on the page: Qwen2.5-VL-7B opened by its Hub id (intercepted: the
// Hub's config.json from the core's fixtures) or pasted, its images typed in, and a fine-tune
// with 1280-pixel images planned onto one 80 GB GPU. Nothing here reaches the network.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { useServerAndBrowser, typeInto, choose, fixture, bytesOf, changedBytes, openPage, urlSettled } from './harness.mjs';

const env = useServerAndBrowser({ before, after });

const HUB = 'https://huggingface.co/';
const QWEN_VL = 'qwen2.5-vl-7b';
/** The whole model, as the Hub lists the checkpoint: the vision tower and its merger are on
 * the GPU with or without images (a text-only batch: their weights, nothing else of theirs). */
const ALL_PARAMS = '8292166656';

const shown = (page, testid) => page.getByTestId(testid).getAttribute('data-value');
const imageTokens = (page) => page.getByTestId('image-tokens').textContent();
const seqLabel = (page) => page.locator('label[for=seq]').textContent();
const visionHidden = (page) => page.getByTestId('vision-settings').evaluate((el) => el.hidden);

/**
 * Answers the Hub's requests of `context` with the core's Qwen2.5-VL config for `config.json`
 * and `files[name]` for the other files (404 where missing); other hosts are refused. Returns
 * the list of URLs asked.
 */
async function routeHub(context, files) {
  const hub = [];
  await context.route(
    (url) => !url.href.startsWith(env.server.origin + '/'),
    async (route) => {
      const url = route.request().url();
      hub.push(url);
      if (!url.startsWith(HUB)) return route.abort();
      const name = url.split('/').pop();
      const body = name === 'config.json' ? await readFile(fixture(QWEN_VL), 'utf8') : files[name];
      return route.fulfill({
        status: body === undefined ? 404 : 200,
        contentType: 'text/plain; charset=utf-8',
        headers: { 'access-control-allow-origin': '*' },
        body: body ?? 'Entry not found',
      });
    },
  );
  return hub;
}

/**
 * Qwen2.5-VL-7B-Instruct's `preprocessor_config.json` (the core's fixture, which its tests
 * read too), its largest image `maxPixels`.
 */
const qwenPreprocessor = async (maxPixels) =>
  (await readFile(fixture('qwen2.5-vl-7b-preprocessor'), 'utf8')).replace('12845056', String(maxPixels));

/** The page in the architecture mode on an H100 80 GB, its model the pasted config. */
async function openCustom(query = '?m=arch&gpu=h100-80') {
  const opened = await openPage(env.browser, env.server.origin + '/' + query);
  await opened.page.getByTestId('total').waitFor();
  await opened.page.getByTestId('model').selectOption('custom');
  return opened;
}

/**
 * Pastes `config` as the model, then types `images` images of `size` and waits for their
 * tokens.
 */
async function pasteWithImages(page, config, images, size) {
  await page.getByTestId('config-json').fill(config);
  await page.waitForFunction(() => document.querySelector('[data-testid="vision-settings"]')?.hidden === false);
  // the sequence field holds the text's tokens: the images' come on top
  assert.equal(await seqLabel(page), 'Text tokens per sample');
  await typeInto(page, 'images', images);
  await typeInto(page, 'image-size', size);
  await page.waitForFunction(() => document.querySelector('[data-testid="image-tokens"]')?.textContent !== '');
}

test('a Qwen2.5-VL config opened by its Hub id shows the image fields; one 1280-pixel image adds its 2,118 tokens and the vision tower', async () => {
  const { page, errors, context } = await openCustom();
  const hub = await routeHub(context, { 'preprocessor_config.json': await qwenPreprocessor(12_845_056) });
  assert.equal(await visionHidden(page), true, 'a text model has no image fields');
  await typeInto(page, 'hub-id', 'Qwen/Qwen2.5-VL-7B-Instruct');
  await page.getByTestId('hub-fetch').click();
  await page.waitForFunction(
    (n) => document.querySelector('[data-testid="n-params"]')?.dataset.value === n,
    ALL_PARAMS,
  );
  // the config, then the processor's sizes (the published ones: the readers' defaults)
  const repo = `${HUB}Qwen/Qwen2.5-VL-7B-Instruct/resolve/main/`;
  assert.deepEqual(hub, [`${repo}config.json`, `${repo}preprocessor_config.json`]);
  assert.match(await page.getByTestId('config-json').inputValue(), /"preprocessor_config":\{\s*"min_pixels": 3136,/);
  assert.equal(await visionHidden(page), false);
  assert.equal(await imageTokens(page), '', 'no images yet');
  // the image fields show their defaults (which links leave out)
  assert.equal(await page.getByTestId('images').inputValue(), '0');
  assert.equal(await page.getByTestId('image-size').inputValue(), '1024x768');
  assert.equal(await page.getByTestId('vision-tower').inputValue(), 'frozen');
  assert.equal(await page.getByTestId('projector').inputValue(), 'trained');
  await urlSettled(page);
  assert.doesNotMatch(page.url(), /[?&](img|isz|vt|vp)=/);
  const textOnly = await bytesOf(page, 'total');

  await typeInto(page, 'images', '1');
  await typeInto(page, 'image-size', '1280x1280');
  // smart_resize keeps 1280 x 1280 (multiples of 28 nearest: 1288), 46 x 46 merged patches
  // and the vision start and end markers: 2,118 tokens before the 2,048 of text
  await page.waitForFunction(() =>
    document.querySelector('[data-testid="image-tokens"]')?.textContent.startsWith('2,118 image tokens'),
  );
  assert.match(await imageTokens(page), /sequence: 4,166 tokens/);
  assert.equal(await shown(page, 'n-params'), ALL_PARAMS);
  const withImage = await changedBytes(page, 'total', textOnly);
  assert.ok(withImage > textOnly, `${withImage} <= ${textOnly}`);

  // the tower trained as well holds its gradients and optimizer states too
  await choose(page, 'vision-tower', 'trained');
  const towerTrained = await changedBytes(page, 'total', withImage);
  assert.ok(towerTrained > withImage);

  // a reload keeps the config and the images, and asks the Hub nothing
  await urlSettled(page);
  await page.reload();
  await page.getByTestId('total').waitFor();
  assert.equal(await page.getByTestId('images').inputValue(), '1');
  assert.equal(await page.getByTestId('image-size').inputValue(), '1280x1280');
  assert.equal(await page.getByTestId('vision-tower').inputValue(), 'trained');
  assert.equal(await bytesOf(page, 'total'), towerTrained);
  assert.equal(hub.length, 2);
  assert.deepEqual(errors, []);
  await context.close();
});

test("a checkpoint's own processor sizes come with its config; without the file, the published ones", async () => {
  for (const [files, tokens] of [
    // a processor that caps images at 28 x 28 x 1280 pixels: 1280 x 1280 becomes 980 x 980
    [{ 'preprocessor_config.json': await qwenPreprocessor(1_003_520) }, '1,227'],
    // no preprocessor_config.json in the repository
    [{}, '2,118'],
  ]) {
    const { page, errors, context } = await openCustom();
    const hub = await routeHub(context, files);
    await typeInto(page, 'hub-id', 'someone/qwen2.5-vl-finetune');
    await page.getByTestId('hub-fetch').click();
    await page.waitForFunction(() => document.querySelector('[data-testid="vision-settings"]')?.hidden === false);
    assert.equal(hub.length, 2);
    assert.equal(await page.getByTestId('hub-error').textContent(), '');
    await typeInto(page, 'images', '1');
    await typeInto(page, 'image-size', '1280x1280');
    await page.waitForFunction(
      (tokens) => document.querySelector('[data-testid="image-tokens"]')?.textContent.startsWith(`${tokens} image tokens`),
      tokens,
    );
    assert.deepEqual(errors.filter((e) => !e.includes('404')), []);
    await context.close();
  }
});

test("a pasted Qwen2.5-VL-7B with 1280-pixel images is planned onto one 80 GB GPU: the first plan's link fits", async () => {
  const { page, errors, context } = await openCustom();
  await pasteWithImages(page, await readFile(fixture(QWEN_VL), 'utf8'), '1', '1280x1280');
  // a full fine-tune of 8.3 B parameters with AdamW does not fit in 80 GB
  await page.locator('[data-testid="fit-verdict"][data-fits="false"]').waitFor();
  const advice = page.getByTestId('fit-advice');
  await advice.getByTestId('fit-plan').first().waitFor();
  assert.equal(await advice.getByTestId('plan-group').first().textContent(), 'On your H100 80 GB');
  const first = advice.getByTestId('fit-plan').first();
  assert.equal(await first.getAttribute('data-gpus'), '1');
  const promised = await first.getAttribute('data-peak-bytes');
  await first.locator('a').click();
  await page.locator('[data-testid="fit-verdict"][data-fits="true"]').waitFor();
  // the plan keeps the images: the same tokens, the peak it promised
  assert.equal(await page.getByTestId('images').inputValue(), '1');
  assert.match(await imageTokens(page), /^2,118 image tokens/);
  assert.equal(String(await bytesOf(page, 'total')), promised);
  assert.ok(BigInt(promised) < 80_000_000_000n);
  assert.deepEqual(errors, []);
  await context.close();
});

test('a bad image size gets its message next to the field until it is mended; a text model hides the image fields', async () => {
  const { page, errors, context } = await openCustom();
  await pasteWithImages(page, await readFile(fixture(QWEN_VL), 'utf8'), '2', '640x480');
  const before = await bytesOf(page, 'total');
  await typeInto(page, 'image-size', '0x5');
  await page.waitForFunction(() => document.querySelector('[data-testid="image-size-error"]')?.textContent !== '');
  assert.match(await page.getByTestId('image-size-error').textContent(), /\S/);
  assert.equal(await page.getByTestId('image-size').getAttribute('aria-invalid'), 'true');
  assert.equal(await bytesOf(page, 'total'), null);
  assert.match(await page.getByTestId('total').textContent(), /Fix the highlighted fields/);
  await typeInto(page, 'image-size', '640x480');
  await page.waitForFunction(() => document.querySelector('[data-testid="image-size-error"]')?.textContent === '');
  assert.equal(await bytesOf(page, 'total'), before);

  // back to a text model: the image fields go away, and so do their tokens
  await page.getByTestId('config-json').fill(await readFile(fixture('qwen3-0.6b'), 'utf8'));
  await page.waitForFunction(() => document.querySelector('[data-testid="vision-settings"]')?.hidden === true);
  assert.equal(await imageTokens(page), '');
  assert.equal(await seqLabel(page), 'Sequence length (tokens)');
  assert.deepEqual(errors, []);
  await context.close();
});

test('every vision-language family reads and estimates in the browser with an image (no trap, no error)', async () => {
  // the validation configs of the six wrappers: their readers and image arithmetic run as
  // the release build's WebAssembly runs them (wasm-opt's no-trap assumptions included)
  const configs = [
    'qwen2.5-vl-7b-4l',
    'qwen3-vl-4b-4l',
    'gemma3-4b-vl-6l',
    'smolvlm2-500m',
    'llava-v1.6-mistral-7b-4l',
    'llama3.2-11b-vision-5l',
  ];
  const { page, errors, context } = await openCustom();
  for (const name of configs) {
    const text = await readFile(new URL(`../../validation/configs/${name}.json`, import.meta.url), 'utf8');
    await pasteWithImages(page, text, '1', '800x600');
    assert.match(await imageTokens(page), /^[\d,]+ image tokens per sample/, name);
    assert.equal(await page.getByTestId('config-json-error').textContent(), '', name);
    const total = await bytesOf(page, 'total');
    assert.ok(total > 0n, `${name}: ${total}`);
    await choose(page, 'vision-tower', 'trained');
    assert.ok((await changedBytes(page, 'total', total)) > total, name);
    await choose(page, 'vision-tower', 'frozen');
    await typeInto(page, 'images', '0');
  }
  assert.deepEqual(errors, []);
  await context.close();
});
