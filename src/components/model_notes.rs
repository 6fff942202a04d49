//! What the estimate of the chosen model leaves out or assumes.

use crate::effect::memo;
use leptos::prelude::*;

use crate::markup::Markup;

/// The notes' items (empty: no notes).
pub fn notes_markup(notes: &[&str]) -> String {
    let mut m = Markup::default();
    for note in notes {
        m.el("li", &[], note);
    }
    m.finish()
}

/// The list around its items ([`notes_markup`]); nothing when there are none.
pub fn model_notes(items: Memo<String>) -> impl IntoView {
    let any = memo(move |_| items.with(|i| !i.is_empty()));
    move || {
        any.get().then(|| {
            view! {
                <ul class="model-notes" data-testid="model-notes" aria-label="About this estimate"
                    inner_html=items></ul>
            }
        })
    }
}

/// The architecture's notes (a multimodal config read for its language model, an attention
/// kernel the family forces), one item each; nothing when there are none.
#[component]
pub fn ModelNotes(
    /// The notes of the model being estimated.
    #[prop(into)]
    notes: Signal<Vec<&'static str>>,
) -> impl IntoView {
    model_notes(memo(move |_| notes.with(|n| notes_markup(n))))
}
