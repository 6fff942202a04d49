//! What the estimate of the chosen model leaves out or assumes.

use leptos::prelude::*;

/// The architecture's notes (a multimodal config read for its language model, an attention
/// kernel the family forces), one item each; nothing when there are none.
#[component]
pub fn ModelNotes(
    /// The notes of the model being estimated.
    #[prop(into)]
    notes: Signal<Vec<&'static str>>,
) -> impl IntoView {
    move || {
        let notes = notes.get();
        (!notes.is_empty()).then(|| {
            view! {
                <ul class="model-notes" data-testid="model-notes" aria-label="About this estimate">
                    {notes.into_iter().map(|note| view! { <li>{note}</li> }).collect_view()}
                </ul>
            }
        })
    }
}
