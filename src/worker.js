// The advisor's Web Worker (see worker.rs). On the page, this module starts the worker on
// itself and passes it the page's compiled WebAssembly module (neither fetched nor compiled
// again) and the URL of its glue; in the worker, it answers each query string with the
// plans' markup, as `query\nmarkup`. Queries that arrive while it searches are not searched
// one by one: only the newest is. A worker that cannot start answers null, and the page then
// searches by itself. A search that fails (a panic is a trap in WebAssembly) says so in the
// advisor's card, and the worker ends: the next query starts a fresh one. The page itself
// keeps working either way.
let boot;
let worker;
// the query last asked, and the last answered
let asked;
let answered;

export function start(reply, module) {
  try {
    // (the glue is named after the module Trunk's loader preloads)
    const glue = document.querySelector('link[rel=preload][as=fetch]').href.replace(/_bg\.wasm$/, '.js');
    boot = () => {
      worker = new Worker(import.meta.url, { type: 'module' });
      worker.onmessage = ({ data }) => {
        if (data !== false) {
          answered = data?.slice(0, data.indexOf('\n'));
          reply(data);
        } else {
          // a newer query than the one that failed is asked again, of a fresh worker
          worker = undefined;
          if (asked !== answered) ask(asked);
        }
      };
      // (a worker that cannot load or run answers as one that failed to start)
      worker.onerror = () => reply(null);
      worker.postMessage([glue, module]);
    };
    boot();
    return true;
  } catch {
    return false;
  }
}

export function ask(query) {
  asked = query;
  if (!worker) boot();
  worker.postMessage(query);
}

if (typeof document == 'undefined') {
  let advise;
  let latest;
  let busy = false;
  const run = () => {
    const query = latest;
    latest = undefined;
    try {
      postMessage(`${query}\n${advise(query)}`);
    } catch {
      // (its module's state is not to be trusted after a trap)
      postMessage(`${query}\n<p class="hint">The advisor stopped on these inputs; the figures above still hold. Change an input to search again.</p>`);
      postMessage(false);
      close();
      return;
    }
    busy = latest !== undefined;
    if (busy) setTimeout(run);
  };
  onmessage = async ({ data }) => {
    if (typeof data == 'string') {
      latest = data;
    } else {
      try {
        const glue = await import(data[0]);
        await glue.default({ module_or_path: data[1] });
        advise = glue.advise_markup;
      } catch {
        postMessage(null);
        return;
      }
    }
    if (advise && latest !== undefined && !busy) {
      busy = true;
      setTimeout(run);
    }
  };
}
