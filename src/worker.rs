//! The advisor's search in a Web Worker (`worker.js`) that runs this same module: the page
//! asks it once the inputs rest and shows its plans once the typing pauses, so the search
//! (tens of milliseconds of allocator replays) overlaps the pause and never holds up a
//! keystroke, and a search that fails (a panic traps the worker's module) says so in the
//! advisor's card instead of stopping the page. Where no worker starts (the browser tests, a
//! page without Trunk's loader, a browser without module workers), the page searches itself,
//! after the pause.

use estimator_core::{decode_query, parse_page, PageState, Scenario};
use wasm_bindgen::prelude::*;

use crate::components::plans_markup;

/// Plans the advisor lists at most.
const ADVICE_LIMIT: usize = 12;

#[wasm_bindgen(module = "/src/worker.js")]
extern "C" {
    /// Starts the worker on `module`, this page's; `reply` gets each answer
    /// (`query\nmarkup`, or null when the worker failed). False where none starts.
    #[wasm_bindgen(js_name = start)]
    fn start_worker(reply: &Closure<dyn FnMut(JsValue)>, module: JsValue) -> bool;
    /// Gives the worker the newest query.
    #[wasm_bindgen(js_name = ask)]
    pub(crate) fn ask_worker(query: &str);
}

/// Starts the advisor's worker; `on_reply` gets each answer as (query, markup), or `None`
/// once the worker has failed. False where no worker starts.
pub(crate) fn start(mut on_reply: impl FnMut(Option<(&str, &str)>) + 'static) -> bool {
    let reply = Closure::new(move |answer: JsValue| {
        let answer = answer.as_string();
        on_reply(answer.as_deref().and_then(|a| a.split_once('\n')));
    });
    // (the compiled module itself: the worker neither fetches nor compiles it again)
    let started = start_worker(&reply, wasm_bindgen::module());
    // (the worker answers for as long as the page lives)
    reply.forget();
    started
}

/// The advisor's plans for `state`, parsed as `scenario`, as the page shows them.
#[must_use]
pub(crate) fn advice_markup(state: &PageState, scenario: &Scenario) -> String {
    plans_markup(
        &scenario
            .advise(state, ADVICE_LIMIT)
            .map_err(|e| e.to_string()),
        state.byte_unit,
    )
}

/// The advisor's plans for the inputs of `query` (what `encode_query` writes), as markup:
/// the worker's entry point.
#[wasm_bindgen]
#[must_use]
pub fn advise_markup(query: &str) -> String {
    let state = decode_query(query).state;
    match parse_page(&state).scenario {
        Ok(scenario) => advice_markup(&state, &scenario),
        Err(e) => plans_markup(&Err(e.to_string()), state.byte_unit),
    }
}
