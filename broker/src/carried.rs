//! Replay recovery's account of a carry-over (`BrokerRequest::CarriedOver`), added to the crash
//! reports of the worker deaths it followed. It is the application's word, not the broker's:
//! bounded here, stored under its own name, printed escaped.

use std::time::{Duration, Instant};

use cloister_crash_reports::{CarriedOver, CrashReport};

use crate::broker::{Death, Granted};

/// How long the reports of the deaths are waited for (their reapers write them as the workers
/// go; one that died while the application was rebuilt may still be being written).
const PATIENCE: Duration = Duration::from_secs(2);

/// The application says it was carried over to its newest worker for `carried.driver`: every
/// earlier worker of that driver whose report does not say so yet gets it, in the background.
pub fn record(granted: &mut [Granted], carried: cloister_ipc::CarriedOver) {
    let Some(newest) = granted.iter().rposition(|g| g.driver == carried.driver) else {
        tracing::warn!("a carry-over to a driver this client has no worker for: ignored");
        return;
    };
    let account = bounded(&carried, granted[newest].note.pid);
    let dead: Vec<_> = granted[..newest]
        .iter_mut()
        .filter(|g| g.driver == carried.driver && !g.carried)
        .map(|g| {
            g.carried = true;
            g.note.clone()
        })
        .collect();
    if dead.is_empty() {
        return;
    }
    // `cloister run` waits for this as for a report being written.
    let pending = crate::broker::report_pending();
    std::thread::spawn(move || {
        let _pending = pending;
        let end = Instant::now() + PATIENCE;
        for note in dead {
            let Some(Death { report: Some(path), .. }) = note.wait(end.saturating_duration_since(Instant::now()))
            else {
                continue;
            };
            match CrashReport::amend(&path, account.clone()) {
                Ok(()) => tracing::info!(report = %path.display(), "crash report: carried over"),
                Err(e) => tracing::warn!(report = %path.display(), "cannot add the carry-over to the report: {e}"),
            }
        }
    });
}

/// The report's account of `carried`, cut to `CarriedOver::MAX_DROPPED` lines of at most
/// `CarriedOver::MAX_LINE` bytes.
fn bounded(carried: &cloister_ipc::CarriedOver, to_worker: u32) -> CarriedOver {
    use cloister_ipc::CarriedOver as Wire;
    let cut = |s: &String| {
        let mut end = s.len().min(Wire::MAX_LINE);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].to_string()
    };
    CarriedOver {
        to_worker,
        objects_rebuilt: carried.objects_rebuilt,
        commands_replayed: carried.commands_replayed,
        objects_lost: carried.objects_lost,
        dropped: carried.dropped.iter().take(Wire::MAX_DROPPED).map(cut).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_application_cannot_make_a_report_grow_without_bound() {
        let wire = cloister_ipc::CarriedOver {
            driver: "pocl".into(),
            objects_rebuilt: 3,
            commands_replayed: 1,
            objects_lost: 0,
            dropped: vec!["é".repeat(1000); 1000],
        };
        let b = bounded(&wire, 7);
        assert_eq!(b.dropped.len(), cloister_ipc::CarriedOver::MAX_DROPPED);
        assert!(b.dropped.iter().all(|l| l.len() <= cloister_ipc::CarriedOver::MAX_LINE && l.starts_with('é')));
        assert_eq!((b.to_worker, b.objects_rebuilt, b.commands_replayed), (7, 3, 1));
    }
}
