//! The bottom of the shim's layering: what every layer may use, importing nothing of the crate.
//! The warning every layer gives, and the process-wide mode the layers below recovery must
//! know of (whether replay recovery keeps its journal).
//!
//! The layers, bottom to top (each imports only those below it):
//! `base` < `conn` (transport) < `handle` < `pending` < `recovery` < `layers` < `runtime`.

use std::sync::OnceLock;

/// A warning for the application's user: logged, and on stderr unless `CLOISTER_QUIET`.
pub fn warn(msg: &str) {
    cloister_ipc::log::in_shim(|| tracing::warn!("{msg}"));
    if !cloister_ipc::settings::quiet() {
        eprintln!("cloister: {msg}");
    }
}

/// Whether replay mode is on (`CLOISTER_RECOVERY=replay`, the default; read once): `recovery`
/// keeps its journal, and the layers below tell it what it records.
pub fn replay() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| cloister_ipc::settings::recovery() == "replay")
}
