//! The few places the page talks to the browser: URL, localStorage, clipboard, title, and
//! the one request it may send (a model's `config.json` from the Hub, on a click).
//!
//! Each function degrades quietly where the browser refuses (no storage in a private
//! window, no clipboard permission): the page keeps working without it.

use estimator_core::{ConfigBody, HubError, HUB_TIMEOUT_SECS};
use gloo_storage::{LocalStorage, Storage};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// The localStorage key of the last inputs (versioned, so a new format can ignore old data).
pub const STORAGE_KEY: &str = "batch-size-memory-estimator:v1";

/// The current query string without its `?`, or empty.
#[must_use]
pub fn current_query() -> String {
    web_sys::window()
        .and_then(|w| w.location().search().ok())
        .map(|q| q.trim_start_matches('?').to_owned())
        .unwrap_or_default()
}

/// Replaces the URL's query string without adding a history entry.
pub fn replace_query(query: &str) {
    let Some(window) = web_sys::window() else {
        return;
    };
    let path = window.location().pathname().unwrap_or_else(|_| "/".into());
    let url = if query.is_empty() {
        path
    } else {
        format!("{path}?{query}")
    };
    if let Ok(history) = window.history() {
        let _ = history.replace_state_with_url(&JsValue::NULL, "", Some(&url));
    }
}

/// The stored inputs, `Ok(None)` when nothing is stored, `Err` when storage is unavailable.
///
/// # Errors
/// A sentence for a person when the browser offers no storage.
pub fn load_stored() -> Result<Option<String>, String> {
    if !storage_available() {
        return Err(
            "This browser does not let the page keep your inputs: they will not be restored on reload."
                .to_owned(),
        );
    }
    LocalStorage::raw()
        .get_item(STORAGE_KEY)
        .map_err(|_| "This browser does not let the page read its saved inputs.".to_owned())
}

/// Stores the inputs; quietly does nothing where storage is unavailable or full.
pub fn store(query: &str) {
    if storage_available() {
        let _ = LocalStorage::raw().set_item(STORAGE_KEY, query);
    }
}

/// Whether localStorage can be reached. gloo's accessor throws (and so kills the app) where
/// the browser refuses storage, as some private windows do, so it is only called after this.
fn storage_available() -> bool {
    web_sys::window().is_some_and(|w| matches!(w.local_storage(), Ok(Some(_))))
}

/// Sets the document's title.
pub fn set_title(title: &str) {
    if let Some(document) = web_sys::window().and_then(|w| w.document()) {
        document.set_title(title);
    }
}

/// Puts `text` on the clipboard.
///
/// # Errors
/// A sentence for a person saying why the clipboard refused.
pub async fn copy_to_clipboard(text: &str) -> Result<(), String> {
    let window = web_sys::window().ok_or("No browser window.")?;
    let clipboard = window.navigator().clipboard();
    wasm_bindgen_futures::JsFuture::from(clipboard.write_text(text))
        .await
        .map(|_| ())
        .map_err(|e| {
            let why = e
                .dyn_ref::<web_sys::js_sys::Error>()
                .map(|e| String::from(e.message()))
                .unwrap_or_else(|| "permission denied".to_owned());
            format!("Copy failed: the browser refused the clipboard ({why}).")
        })
}

/// Fetches the `config.json` at `url` (the Hub's: the page's CSP lets no other host be
/// reached) without credentials, gives up after [`HUB_TIMEOUT_SECS`], and reads the answer
/// piece by piece as a pasted config: refused, and the download stopped, past the cap. With
/// `as_config` false the answer is another file of the repository, kept as text.
///
/// # Errors
/// What a person can act on: not found, gated, unreachable, too slow, too large, not a
/// config this estimator reads.
pub async fn fetch_config(url: &str, as_config: bool) -> Result<String, HubError> {
    let window = web_sys::window().ok_or(HubError::Unreachable)?;
    let controller = web_sys::AbortController::new().map_err(|_| HubError::Unreachable)?;
    let signal = controller.signal();
    let init = web_sys::RequestInit::new();
    init.set_credentials(web_sys::RequestCredentials::Omit);
    init.set_signal(Some(&signal));
    let timer = controller.clone();
    leptos::prelude::set_timeout(
        move || timer.abort(),
        std::time::Duration::from_secs(HUB_TIMEOUT_SECS.into()),
    );
    // a refused or unreachable request rejects alike; an aborted one ran out of time
    let failed = |_| {
        if signal.aborted() {
            HubError::Timeout
        } else {
            HubError::Unreachable
        }
    };
    let answer = async {
        let response: web_sys::Response =
            JsFuture::from(window.fetch_with_str_and_init(url, &init))
                .await
                .map_err(failed)?
                .unchecked_into();
        if let Some(why) = HubError::from_status(response.status()) {
            return Err(why);
        }
        let announced = response
            .headers()
            .get("content-length")
            .ok()
            .flatten()
            .and_then(|n| n.trim().parse().ok());
        let mut body = ConfigBody::new(announced)?;
        if let Some(stream) = response.body() {
            let reader: web_sys::ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
            loop {
                let next = JsFuture::from(reader.read()).await.map_err(failed)?;
                let field = |name: &str| {
                    web_sys::js_sys::Reflect::get(&next, &JsValue::from_str(name))
                        .unwrap_or_default()
                };
                if field("done").as_bool() != Some(false) {
                    break;
                }
                body.push(&web_sys::js_sys::Uint8Array::new(&field("value")).to_vec())?;
            }
        }
        if as_config {
            body.finish()
        } else {
            body.finish_text()
        }
    }
    .await;
    // stops a download still under way (an error status, a body past the cap)
    controller.abort();
    answer
}
