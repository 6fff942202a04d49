//! Notices about inputs that were ignored when the page was opened.

use leptos::prelude::*;

/// What was ignored from the link or the saved inputs, with a button to dismiss it.
#[component]
pub fn Notices(
    /// One sentence per ignored part.
    notices: RwSignal<Vec<String>>,
) -> impl IntoView {
    view! {
        <Show when=move || notices.with(|n| !n.is_empty())>
            <div class="notices" data-testid="notices" role="status">
                <p class="notices-title">"Some settings could not be used and were reset to their defaults:"</p>
                <ul>
                    {move || {
                        notices
                            .get()
                            .into_iter()
                            .map(|n| view! { <li data-testid="notice">{n}</li> })
                            .collect_view()
                    }}
                </ul>
                <button
                    type="button"
                    class="secondary"
                    data-testid="dismiss-notices"
                    on:click=move |_| notices.set(Vec::new())
                >
                    "Dismiss"
                </button>
            </div>
        </Show>
    }
}
