//! The page's side effects (storage, title, the advisor, writing the form).

use leptos::prelude::*;
use leptos::reactive::effect::RenderEffect;

/// Runs `f` now, and again whenever a signal it read changes, for as long as the current
/// owner lives (the page, or the component calling it).
///
/// One render effect type serves every effect of the page: Leptos' `Effect::new` compiles a
/// task of its own for each closure, some 2 KB of WebAssembly each; the closure is boxed so
/// that creating the effect is compiled once.
pub fn watch(f: impl FnMut() + 'static) {
    watch_boxed(Box::new(f));
}

/// [`watch`] with its closure boxed.
#[inline(never)]
fn watch_boxed(mut f: Box<dyn FnMut()>) {
    let effect = RenderEffect::new(move |_| f());
    on_cleanup(move || drop(effect));
}

/// A memo of `f`: `Memo::new` with the closure boxed, so that the code that creates a memo
/// (its arena slot, its owner) is compiled once per value type instead of once per memo.
pub(crate) fn memo<T: PartialEq + Send + Sync + 'static>(
    f: impl Fn(Option<&T>) -> T + Send + Sync + 'static,
) -> Memo<T> {
    boxed_memo(Box::new(f))
}

/// A memo's function, boxed.
type MemoFn<T> = Box<dyn Fn(Option<&T>) -> T + Send + Sync>;

#[inline(never)]
fn boxed_memo<T: PartialEq + Send + Sync + 'static>(f: MemoFn<T>) -> Memo<T> {
    Memo::new(f)
}
