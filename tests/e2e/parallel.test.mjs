// Several GPUs as a person plans them: a 70B full fine-tune over 64 GPUs with FSDP2 x TP x PP,
// read per GPU at the busiest pipeline stage, with the groups checked against the GPUs, offload
// and its host RAM, NCCL's buffers in the verdict, and the plan carried by a link.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { useServerAndBrowser, openPage, bytesOf, typeInto, urlSettled, choose } from './harness.mjs';

const env = useServerAndBrowser({ before, after });
const base = '/?m=arch&model=llama3.3-70b&b=1&s=4096&r=bf16&o=adamw&gc=full&gpu=h100-80';

test('a 70B full fine-tune over 64 GPUs with FSDP2 x TP x PP fits, read at its busiest stage', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin + base);
  assert.equal(await page.getByTestId('fit-verdict').getAttribute('data-fits'), 'false');
  const one = await bytesOf(page, 'total');

  await typeInto(page, 'num-gpus', '64');
  await choose(page, 'sharding', 'fsdp2');
  await typeInto(page, 'tensor-parallel', '8');
  await choose(page, 'sequence-parallel', 'on');
  await choose(page, 'loss-parallel', 'on');
  await typeInto(page, 'pipeline-parallel', '4');

  // 64 = 2 data-parallel x 8 tensor x 4 pipeline: each GPU holds a quarter of the layers' share
  const perGpu = await bytesOf(page, 'total');
  assert.ok(perGpu * 20n < one, `${perGpu} per GPU against ${one} on one`);
  assert.equal(await page.getByTestId('fit-verdict').getAttribute('data-fits'), 'true');
  const stage = await page.getByTestId('pipeline-stage').textContent();
  assert.match(stage, /stage [1-4] of 4/i);
  assert.match(await page.getByTestId('per-gpu-note').textContent(), /per GPU/);
  // NCCL: a communicator for each of the data, tensor and pipeline groups
  assert.equal(await bytesOf(page, 'need-communication'), 3n * 512n * 1048576n);
  const needed = await bytesOf(page, 'need-total');
  assert.equal(needed, (await bytesOf(page, 'need-peak')) + (await bytesOf(page, 'need-reserve'))
    + (await bytesOf(page, 'need-context')) + (await bytesOf(page, 'need-communication')));

  // the groups must divide the GPUs: a clear error next to the field, the rest keeps working
  await typeInto(page, 'num-gpus', '60');
  assert.match(await page.getByTestId('num-gpus-error').textContent(), /multiple of .*\(32\)/);
  await typeInto(page, 'num-gpus', '64');
  assert.equal(await bytesOf(page, 'total'), perGpu);

  // the link carries the plan: a fresh page shows the same GPU at the same stage
  await urlSettled(page);
  const params = new URL(page.url()).searchParams;
  for (const [key, value] of [['gpus', '64'], ['shard', 'fsdp2'], ['tp', '8'], ['sp', 'on'], ['lp', 'on'], ['pp', '4']]) {
    assert.equal(params.get(key), value, key);
  }
  const again = await openPage(env.browser, page.url());
  assert.equal(await bytesOf(again.page, 'total'), perGpu);
  assert.equal(await again.page.getByTestId('pipeline-stage').textContent(), stage);
  await again.context.close();

  // a reload keeps it too
  await page.reload();
  assert.equal(await bytesOf(page, 'total'), perGpu);
  assert.deepEqual(errors, []);
  await context.close();
});

test('offload moves state to host RAM, shown beside the verdict', async () => {
  const { page, context } = await openPage(env.browser, env.server.origin
    + '/?m=arch&model=llama3-8b&b=1&s=2048&r=mixed-bf16&o=adamw&gc=full&gpu=rtx4090&gpus=8&shard=zero3');
  const onGpu = await bytesOf(page, 'total');
  assert.equal(await page.getByTestId('host-ram').count(), 0);
  await choose(page, 'offload', 'optimizer+params');
  const offloaded = await bytesOf(page, 'total');
  assert.ok(offloaded < onGpu, `${offloaded} >= ${onGpu}`);
  // ZeRO-3 offloads 20 bytes per parameter of the rank's partition: about 20 GB of 8B / 8
  const host = await bytesOf(page, 'host-ram');
  assert.ok(host > 19_000_000_000n && host < 21_000_000_000n, `${host}`);
  // DDP cannot offload: the field says so
  await choose(page, 'sharding', 'ddp');
  assert.match(await page.getByTestId('offload-error').textContent(), /FSDP or DeepSpeed/);
  await context.close();
});

test('FSDP1 as accelerate wraps a model: its strategy, units and prefetch move the figures', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin
    + '/?m=arch&model=llama3.2-1b&b=2&s=2048&r=mixed-bf16&o=adamw&gc=full&gpu=h100-80&gpus=8');
  const ddp = await bytesOf(page, 'total');
  await choose(page, 'sharding', 'ddp');
  assert.ok(await page.getByTestId('fsdp1-sharding').isHidden());
  await choose(page, 'sharding', 'fsdp1');
  assert.ok(await page.getByTestId('fsdp1-sharding').isVisible());
  // accelerate's defaults: FULL_SHARD, NO_WRAP (one unit: the whole model gathered from
  // forward to the end of backward), no backward prefetch, use_orig_params off
  assert.equal(await page.getByTestId('fsdp1-sharding').inputValue(), 'full');
  assert.equal(await page.getByTestId('fsdp1-wrap').inputValue(), 'none');
  assert.ok(await page.getByTestId('gpus-per-node').isHidden());
  const noWrap = await bytesOf(page, 'total');
  assert.ok(noWrap < ddp, `${noWrap} >= ${ddp}`);
  await choose(page, 'fsdp1-wrap', 'layers');
  const layers = await bytesOf(page, 'total');
  assert.ok(layers < noWrap, `${layers} >= ${noWrap}`);
  // BACKWARD_PRE holds the next layer gathered beside the running one
  await choose(page, 'backward-prefetch', 'pre');
  const pre = await bytesOf(page, 'total');
  assert.ok(pre > layers, `${pre} <= ${layers}`);
  // SHARD_GRAD_OP keeps every layer gathered to its backward: as much as NO_WRAP's one unit
  await choose(page, 'fsdp1-sharding', 'grad-op');
  const gradOp = await bytesOf(page, 'total');
  assert.ok(gradOp > pre, `${gradOp} <= ${pre}`);
  // NO_SHARD: one GPU's step, without DDP's buckets
  await choose(page, 'fsdp1-sharding', 'no-shard');
  const noShard = await bytesOf(page, 'total');
  assert.ok(noShard > gradOp && noShard < ddp, `${noShard}`);
  // HYBRID_SHARD: sharded within a node of 4, between FULL_SHARD and NO_SHARD
  await choose(page, 'fsdp1-sharding', 'hybrid');
  await typeInto(page, 'gpus-per-node', '4');
  const hybrid = await bytesOf(page, 'total');
  assert.ok(hybrid > pre && hybrid < noShard, `${hybrid}`);
  await typeInto(page, 'gpus-per-node', '3');
  assert.match(await page.getByTestId('gpus-per-node-error').textContent(), /divide/);
  await typeInto(page, 'gpus-per-node', '4');
  assert.equal(await bytesOf(page, 'total'), hybrid);
  // use_orig_params moves nothing (measured): the figures stay
  await choose(page, 'use-orig-params', 'on');
  assert.equal(await bytesOf(page, 'total'), hybrid);

  // the link carries FSDP1's settings, and a fresh page shows the same figures
  await urlSettled(page);
  const params = new URL(page.url()).searchParams;
  for (const [key, value] of [['shard', 'fsdp1'], ['f1s', 'hybrid'], ['f1w', 'layers'], ['bp', 'pre'], ['gpn', '4'], ['uop', 'on']]) {
    assert.equal(params.get(key), value, key);
  }
  const again = await openPage(env.browser, page.url());
  assert.equal(await bytesOf(again.page, 'total'), hybrid);
  await again.context.close();
  // the other engines' links do not carry them
  await choose(page, 'sharding', 'fsdp2');
  await urlSettled(page);
  assert.equal(new URL(page.url()).searchParams.get('f1s'), null);
  assert.deepEqual(errors, []);
  await context.close();
});

test('float8 training: said on the page, FSDP2 gathers float8 weights a byte each', async () => {
  const { page, errors, context } = await openPage(env.browser, env.server.origin
    + '/?m=arch&model=llama3-8b&b=1&s=4096&r=mixed-bf16&o=adamw&gc=full&gpu=h100-80&gpus=8&shard=fsdp2&raf=off');
  // (every layer kept gathered from its forward to its backward: what the float8 all-gather halves)
  const bf16 = await bytesOf(page, 'total');
  assert.ok(await page.getByTestId('model-notes').isHidden());
  await choose(page, 'float8', 'tensorwise');
  // the step saves what bf16 saves: the same figures, and a note on what is left out
  assert.equal(await bytesOf(page, 'total'), bf16);
  assert.match(await page.getByTestId('model-notes').textContent(), /float8 training/);
  await choose(page, 'float8-all-gather', 'on');
  const gathered = await bytesOf(page, 'total');
  assert.ok(gathered < bf16, `${gathered} >= ${bf16}`);
  // rowwise scaling has no float8 all-gather: said next to the field
  await choose(page, 'float8', 'rowwise');
  assert.match(await page.getByTestId('float8-all-gather-error').textContent(), /tensorwise/);
  await choose(page, 'float8', 'tensorwise');
  assert.equal(await bytesOf(page, 'total'), gathered);
  await urlSettled(page);
  const params = new URL(page.url()).searchParams;
  assert.equal(params.get('f8'), 'tensorwise');
  assert.equal(params.get('f8ag'), 'on');
  assert.deepEqual(errors, []);
  await context.close();
});
