// The advisor's Web Worker (see worker.rs). On the page, this module starts the worker on
// itself and passes it the page's compiled WebAssembly module (neither fetched nor compiled
// again) and the URL of its glue; in the worker, it answers each query string with the plans'
// markup, as `query\nmarkup`. Queries that arrive while it searches are not searched one by one: only
// the newest is. A failure answers null, and the page then searches by itself.
let worker;

export function start(reply, module) {
  try {
    // (the glue is named after the module Trunk's loader preloads)
    const glue = document.querySelector('link[rel=preload][as=fetch]').href.replace(/_bg\.wasm$/, '.js');
    worker = new Worker(import.meta.url, { type: 'module' });
    worker.onmessage = (e) => reply(e.data);
    // (a worker that cannot load or run answers as one that failed)
    worker.onerror = () => reply(null);
    worker.postMessage([glue, module]);
    return true;
  } catch {
    return false;
  }
}

export function ask(query) {
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
      postMessage(null);
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
