//! Notices about inputs that were ignored when the page was opened.

use leptos::prelude::*;

use crate::markup::Markup;

/// What was ignored from the link or the saved inputs, with a button to dismiss it.
#[component]
pub fn Notices(
    /// One sentence per ignored part.
    notices: RwSignal<Vec<String>>,
) -> impl IntoView {
    let items = Memo::new(move |_| {
        let mut m = Markup::default();
        notices.with(|all| {
            for notice in all {
                m.el("li", &[("data-testid", "notice")], notice);
            }
        });
        m.finish()
    });
    let any = Memo::new(move |_| notices.with(|n| !n.is_empty()));
    move || {
        any.get().then(|| {
            view! {
                <div class="notices" data-testid="notices" role="status">
                    <p class="notices-title">"Some settings could not be used and were reset to their defaults:"</p>
                    <ul inner_html=items></ul>
                    <button
                        type="button"
                        class="secondary"
                        data-testid="dismiss-notices"
                        on:click=move |_| notices.set(Vec::new())
                    >
                        "Dismiss"
                    </button>
                </div>
            }
        })
    }
}
