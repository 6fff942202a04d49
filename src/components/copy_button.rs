//! A button that copies text to the clipboard and says how it went.

use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::browser::copy_to_clipboard;
use crate::effect::memo;
use crate::markup::text_markup;

/// How long "Copied!" stays before the button reads its label again.
const CONFIRMATION_MS: u64 = 2000;

/// Copies the text of `text` when pressed; then shows "Copied!" or what went wrong.
#[component]
pub fn CopyButton(
    /// The button's label.
    label: &'static str,
    /// Its `data-testid`.
    testid: &'static str,
    /// The text to copy, computed when pressed.
    text: Memo<String>,
) -> impl IntoView {
    let status = RwSignal::new(None::<Result<(), String>>);
    let on_click = move |_| {
        let text = text.get_untracked();
        spawn_local(async move {
            let result = copy_to_clipboard(&text).await;
            let succeeded = result.is_ok();
            status.set(Some(result));
            if succeeded {
                set_timeout(
                    move || status.set(None),
                    std::time::Duration::from_millis(CONFIRMATION_MS),
                );
            }
        });
    };
    let button_text = memo(move |_| {
        status.with(|s| text_markup(if s == &Some(Ok(())) { "Copied!" } else { label }))
    });
    let status_text = memo(move |_| {
        status.with(|s| {
            text_markup(match s {
                Some(Err(why)) => why,
                Some(Ok(())) => "Copied to the clipboard.",
                None => "",
            })
        })
    });
    view! {
        <span class="copy">
            <button type="button" data-testid=testid on:click=on_click inner_html=button_text></button>
            <span class="copy-status" role="status" data-testid=format!("{testid}-status")
                inner_html=status_text></span>
        </span>
    }
}
