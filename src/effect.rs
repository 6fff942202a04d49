//! The page's side effects (storage, title, the advisor, writing the form).

use leptos::prelude::*;
use leptos::reactive::effect::RenderEffect;

/// Runs `f` now, and again whenever a signal it read changes, for as long as the current
/// owner lives (the page, or the component calling it).
///
/// One render effect type serves every effect of the page: Leptos' `Effect::new` compiles a
/// task of its own for each closure, some 2 KB of WebAssembly each.
pub fn watch(mut f: impl FnMut() + 'static) {
    let effect = RenderEffect::new(move |_| f());
    on_cleanup(move || drop(effect));
}
