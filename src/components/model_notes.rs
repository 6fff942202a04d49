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

/// The list around its items ([`notes_markup`]); hidden when there are none.
pub fn model_notes(items: Memo<String>) -> impl IntoView {
    let none = memo(move |_| items.with(String::is_empty));
    view! {
        <ul class="model-notes" data-testid="model-notes" aria-label="About this estimate"
            hidden=none inner_html=items></ul>
    }
}

/// The architecture's notes (a multimodal config read for its language model, an attention
/// kernel the family forces), one item each; hidden when there are none.
#[component]
pub fn ModelNotes(
    /// The notes of the model being estimated.
    #[prop(into)]
    notes: Signal<Vec<&'static str>>,
) -> impl IntoView {
    model_notes(memo(move |_| notes.with(|n| notes_markup(n))))
}
