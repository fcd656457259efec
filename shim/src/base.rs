//! The bottom of the shim's layering: what every layer may use, importing nothing of the crate.
//! The warning every layer gives, and the process-wide mode the layers below recovery must
//! know of (whether replay recovery keeps its journal).
//!
//! The layers of the shim's core, bottom to top (each imports only those below it):
//! - leaves, which import nothing of the crate: `base`, `mirror`, `queue_state`, `stdio_relay`;
//! - `conn`, the transport (with `conn::spill`);
//! - `handle`, the handle table;
//! - `pending`, the transfers under way;
//! - `recovery` (which needs no `pending`);
//! - `runtime`, the top (with `runtime::layers`: the one `conn::Above`, through which the
//!   layers below reach those above them).

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
