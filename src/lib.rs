//! The estimator page: reactive inputs over `estimator-core`, rendered with Leptos.
//!
//! The crate is thin on purpose: every figure comes from the core crate; this crate holds
//! signals, components and the few bridges to the browser (URL, storage, clipboard).

mod alloc;
mod app;
pub mod browser;
pub mod components;
mod effect;
mod form;
mod markup;
mod worker;

pub use alloc::SizeClasses;
pub use app::App;
pub use form::input_form;
pub use worker::advise_markup;

/// The page's allocator (see [`SizeClasses`]) for the page and its browser tests.
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static HEAP: SizeClasses = SizeClasses::new();
