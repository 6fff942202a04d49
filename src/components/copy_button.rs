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
    // whether the text was copied ("Copied!" for a while), or why it was not: signals of
    // types the page has already (a type of signal of its own costs its own code)
    let copied = RwSignal::new(false);
    let failure = RwSignal::new(None::<String>);
    let on_click = move |_| {
        let text = text.get_untracked();
        spawn_local(async move {
            let result = copy_to_clipboard(&text).await;
            copied.set(result.is_ok());
            failure.set(result.err());
            if copied.get_untracked() {
                set_timeout(
                    move || {
                        copied.set(false);
                        failure.set(None);
                    },
                    std::time::Duration::from_millis(CONFIRMATION_MS),
                );
            }
        });
    };
    let button_text = memo(move |_| text_markup(if copied.get() { "Copied!" } else { label }));
    let status_text = memo(move |_| {
        failure.with(|why| {
            text_markup(match why {
                Some(why) => why,
                None if copied.get() => "Copied to the clipboard.",
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
