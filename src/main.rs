//! Mounts the estimator page; everything else lives in the library crate.
use batch_size_estimator::App;

fn main() {
    // Panic messages in the console while developing (`trunk serve`); the release bundle goes
    // without the hook (about 1 KB gzipped): the app is written not to panic, and a panic
    // still surfaces there as an uncaught `unreachable` error.
    #[cfg(debug_assertions)]
    console_error_panic_hook::set_once();
    // The advisor's worker runs this module too (`advise_markup`): there is no page to mount.
    if web_sys::window().is_some() {
        leptos::mount::mount_to_body(App);
    }
}
