//! The page's own explanations: summary, how it works, use cases and FAQ.

use estimator_core::Mode;
use leptos::{html::Section, prelude::*};

use crate::effect::watch;

/// The explanations, static HTML written for this page (in `explanations.html`, beside
/// this file): both "How it works" parts start hidden, and the page shows its mode's.
const EXPLANATIONS: &str = include_str!("explanations.html");

/// Static explanations written for this page. `<details>` keeps the FAQ short to scan and
/// usable by keyboard without any script.
/// "How it works" follows the mode the page is in.
#[component]
pub fn Explanations(
    /// The mode of the page: the explanation of the other mode is hidden.
    mode: Memo<Mode>,
) -> impl IntoView {
    let section = NodeRef::<Section>::new();
    // Static text is set once (which keeps the FAQ's open items open); the mode shows one part.
    watch(move || {
        let mode = mode.get();
        let Some(section) = section.get() else {
            return;
        };
        for (testid, shown) in [
            ("how-simple", mode == Mode::Simple),
            ("how-architecture", mode == Mode::Architecture),
        ] {
            if let Ok(Some(part)) = section.query_selector(&format!("[data-testid={testid}]")) {
                let _ = part.toggle_attribute_with_force("hidden", !shown);
            }
        }
    });
    view! {
        <section class="card explanations" aria-labelledby="about-title" data-testid="explanations"
            node_ref=section inner_html=EXPLANATIONS></section>
    }
}
