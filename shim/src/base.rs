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

/// `CLOISTER_RECOVERY` (read once).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RecoveryMode {
    Report,
    Replay,
    /// Replay for a driver whose devices all share the host's memory (its buffers are
    /// zero-copy, so the journal copies next to nothing), report for the others; settled per
    /// worker (`conn::Conn::replays`).
    Auto,
}

#[inline]
pub fn recovery_mode() -> RecoveryMode {
    static MODE: OnceLock<RecoveryMode> = OnceLock::new();
    *MODE.get_or_init(|| match cloister_ipc::settings::recovery().as_str() {
        "auto" => RecoveryMode::Auto,
        "report" => RecoveryMode::Report,
        _ => RecoveryMode::Replay,
    })
}

/// Whether any worker of this process may be replayed (`recovery` may keep a journal, and a
/// call that met a death may wait for a carry-over).
#[inline]
pub fn replay() -> bool {
    recovery_mode() != RecoveryMode::Report
}
