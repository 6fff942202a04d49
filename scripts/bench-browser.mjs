// Browser benchmark (figures, not a test): in headless Chromium, the time from an input
// event to the updated numbers (median of 100 changes) and from navigation to the first
// complete render (median of 10 loads). Run after `trunk build --release`.
import { serveDist, launch } from '../tests/e2e/harness.mjs';

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const server = await serveDist();
const browser = await launch();
const page = await browser.newPage();

const loads = [];
for (let i = 0; i < 10; i++) {
  await page.goto(`${server.origin}/?gpu=h100-80&r=${i}`.replace(/&r=\d+$/, ''));
  await page.getByTestId('sweep-row').first().waitFor();
  const t = await page.evaluate(() => {
    const nav = performance.getEntriesByType('navigation')[0];
    return performance.now() - nav.startTime;
  });
  loads.push(t);
}

async function inputLatency(query, field, values) {
  await page.goto(`${server.origin}/?${query}`);
  await page.getByTestId('total').waitFor();
  return page.evaluate(
    async ({ field, values }) => {
      const input = document.querySelector(`[data-testid="${field}"]`);
      const figure = () => document.querySelector('[data-testid="total"]')?.dataset.bytes;
      const times = [];
      for (const value of values) {
        const before = figure();
        const start = performance.now();
        input.value = value;
        input.dispatchEvent(new Event('input', { bubbles: true }));
        // Wait (microtask by microtask, then task by task) until the figure has changed.
        for (let turn = 0; figure() === before && turn < 10_000; turn++) {
          await (turn < 100 ? Promise.resolve() : new Promise((r) => setTimeout(r, 0)));
        }
        times.push(performance.now() - start);
      }
      return times;
    },
    { field, values },
  );
}

// Each value differs from every other, so every change moves the figure and no step is one
// the page has seen (its allocator replays are cached by step).
const batches = Array.from({ length: 100 }, (_, i) => String(1 + i));
const simple = await inputLatency('gpu=h100-80', 'batch', batches);
const arch = await inputLatency('m=arch&model=llama3-8b&s=2048&gpu=h100-80&n=8&shard=zero2', 'batch', batches);

// The advisor: from a change of the inputs to its refreshed plans, less the 150 ms it waits
// for typing to pause (Llama 3 8B on an RTX 4090, which does not fit). Its worker searches
// during the pause, so this is what a person waits for once they stop typing.
async function advisorTime() {
  await page.goto(`${server.origin}/?m=arch&model=llama3-8b&gpu=rtx4090&b=1&s=2048`);
  await page.locator('[data-testid="fit-advice"] a[href]').first().waitFor();
  const times = [];
  for (let i = 0; i < 10; i++) {
    const seq = String(2000 + i);
    times.push(
      await page.evaluate(async (seq) => {
        const input = document.querySelector('[data-testid="seq"]');
        const advice = document.querySelector('[data-testid="fit-advice"]');
        const fresh = () => advice.querySelector('a[href]')?.getAttribute('href').includes(`s=${seq}&`);
        // the moment the plans change, seen by an observer (polling with timers would add
        // up to the browser's 4 ms clamp)
        const done = new Promise((resolve) => {
          const observer = new MutationObserver(() => {
            if (fresh()) {
              observer.disconnect();
              resolve(performance.now());
            }
          });
          observer.observe(advice, { subtree: true, childList: true, attributes: true });
        });
        const start = performance.now();
        input.value = seq;
        input.dispatchEvent(new Event('input', { bubbles: true }));
        return (await done) - start - 150;
      }, seq),
    );
  }
  return times;
}
const advisor = await advisorTime();

// The search itself, on the same inputs: the worker's entry point (`advise_markup`) called on
// the page's thread, each time for a sequence length not searched before.
const search = await page.evaluate(() => {
  const times = [];
  for (let i = 0; i < 10; i++) {
    const start = performance.now();
    window.wasmBindings.advise_markup(`m=arch&model=llama3-8b&gpu=rtx4090&b=1&s=${3000 + i}`);
    times.push(performance.now() - start);
  }
  return times;
});

console.log(`navigation to first complete render (median of ${loads.length}): ${median(loads).toFixed(1)} ms`);
console.log(`input to updated numbers, simple mode (median of 100): ${median(simple).toFixed(2)} ms`);
console.log(`input to updated numbers, architecture mode, Llama-3-8B (median of 100): ${median(arch).toFixed(2)} ms`);
console.log(`advisor: Llama-3-8B on an RTX 4090, change to refreshed plans less the 150 ms pause (median of 10): ${median(advisor).toFixed(1)} ms`);
console.log(`advisor's search itself, as its worker runs it (median of 10): ${median(search).toFixed(1)} ms`);
await browser.close();
await server.close();
