//! Notices about inputs that were ignored when the page was opened.

use leptos::prelude::*;

use crate::effect::{memo, watch};

/// What was ignored from the link or the saved inputs, with a button to dismiss it.
#[component]
pub fn Notices(
    /// One sentence per ignored part.
    notices: RwSignal<Vec<String>>,
) -> impl IntoView {
    let list = NodeRef::<leptos::html::Ul>::new();
    // A notice quotes what the link or the storage held: each is a text node, never parsed
    // as markup.
    watch(move || {
        let Some(ul) = list.get() else { return };
        ul.set_text_content(None);
        notices.with(|all| {
            for notice in all {
                if let Ok(li) = document().create_element("li") {
                    let _ = li.set_attribute("data-testid", "notice");
                    li.set_text_content(Some(notice));
                    let _ = ul.append_child(&li);
                }
            }
        });
    });
    let none = memo(move |_| notices.with(Vec::is_empty));
    view! {
        <div class="notices" data-testid="notices" role="status" hidden=none>
            <p class="notices-title">"Some settings could not be used and were reset to their defaults:"</p>
            <ul node_ref=list></ul>
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
}
