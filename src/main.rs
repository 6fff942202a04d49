//! Mounts the estimator page; everything else lives in the library crate.
use batch_size_estimator::App;

fn main() {
    console_error_panic_hook::set_once();
    leptos::mount::mount_to_body(App);
}
