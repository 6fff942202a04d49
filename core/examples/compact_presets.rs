//! Rewrites `src/arch/presets/*.json` in the compact form the readers produce (only the fields
//! they use), keeping the bundle small: `cargo run -p estimator-core --example compact_presets`.
fn main() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/arch/presets");
    for preset in estimator_core::Preset::ALL {
        match preset.architecture() {
            Ok(arch) => {
                let path = format!("{dir}/{}.json", preset.key());
                if let Err(e) = std::fs::write(&path, arch.to_config_json() + "\n") {
                    eprintln!("{path}: {e}");
                }
            }
            Err(e) => eprintln!("{}: {e}", preset.key()),
        }
    }
}
