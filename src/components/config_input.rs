//! Pasting or uploading a Hugging Face `config.json`.
//!
//! The page's form draws the same markup from data (`form.rs`); this component is the
//! same control on its own.

use estimator_core::ModelFamily;
use leptos::prelude::*;
use leptos::task::spawn_local;
use wasm_bindgen::JsCast;

/// A text area for a pasted `config.json`, a file picker that fills it, and the parse error.
#[component]
pub fn ConfigInput(
    /// The text in the area.
    #[prop(into)]
    value: Signal<String>,
    /// Called with the new text.
    on_change: Callback<String>,
    /// Why the config cannot be used, if it cannot.
    #[prop(into)]
    error: Signal<Option<String>>,
) -> impl IntoView {
    let on_file = move |ev: web_sys::Event| {
        let Some(input) = ev
            .target()
            .and_then(|t| t.dyn_into::<web_sys::HtmlInputElement>().ok())
        else {
            return;
        };
        let Some(file) = input.files().and_then(|files| files.get(0)) else {
            return;
        };
        spawn_local(async move {
            let text = wasm_bindgen_futures::JsFuture::from(file.text())
                .await
                .ok()
                .and_then(|t| t.as_string())
                .unwrap_or_default();
            on_change.run(text);
        });
    };
    view! {
        <div class="field" class:invalid=move || error.with(Option::is_some)>
            <label for="config-json">"config.json"</label>
            <textarea
                id="config-json"
                data-testid="config-json"
                spellcheck="false"
                placeholder="Paste a Hugging Face config.json"
                prop:value=move || value.get()
                aria-invalid=move || if error.with(Option::is_some) { "true" } else { "false" }
                aria-describedby="config-json-hint config-json-error"
                on:input=move |ev| on_change.run(event_target_value(&ev))
            ></textarea>
            <span class="hint" id="config-json-hint" data-testid="config-json-types">
                {format!("Supported model_type values: {}.", ModelFamily::supported_model_types())}
            </span>
            <label for="config-file" class="file-label">"…or upload the file"</label>
            <input id="config-file" data-testid="config-file" type="file" accept=".json,application/json" on:change=on_file />
            <span class="error" id="config-json-error" data-testid="config-json-error" role="alert">
                {move || error.get().unwrap_or_default()}
            </span>
        </div>
    }
}
