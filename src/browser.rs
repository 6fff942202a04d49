//! The few places the page talks to the browser: URL, localStorage, clipboard, title.
//!
//! Each function degrades quietly where the browser refuses (no storage in a private
//! window, no clipboard permission): the page keeps working without it.

use gloo_storage::{LocalStorage, Storage};
use wasm_bindgen::{JsCast, JsValue};

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
