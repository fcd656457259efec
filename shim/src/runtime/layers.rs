//! The top joins the layers: the one `conn::Above`, through which the transport, the handle
//! table and pending transfers reach what is above them (handles, pending transfers, recovery,
//! restarts, the entry points and `intercept`'s timing) without importing it. Every connection
//! is made with it (`Conn::connect(.., &LAYERS)`), the fuzz harness's too.

use std::sync::Arc;

use cloister_ipc::dispatch::IcdDispatch;
use cloister_ipc::{Enumerated, ObjectId, ObjectKind};

use crate::conn::{Above, Conn, EventNotifyFn};

/// The layers above the transport, as `conn::Above` describes them.
pub struct Layers;

pub static LAYERS: Layers = Layers;

impl Above for Layers {
    fn adopt(
        &self,
        conn: &Arc<Conn>,
        platforms: &[ObjectId],
        devices: &[Enumerated],
        reuse: Option<&[(usize, Vec<usize>)]>,
    ) -> Vec<(usize, Vec<usize>)> {
        crate::handle::adopt(conn, platforms, devices, reuse)
    }

    fn settle(&self, conn: &Conn) {
        crate::pending::settle(conn);
    }

    fn release(&self, handle: usize, kind: ObjectKind) {
        crate::handle::release(handle as *mut std::ffi::c_void, kind);
    }

    fn event_id(&self, handle: usize) -> Option<ObjectId> {
        crate::handle::lookup(handle as *const std::ffi::c_void, ObjectKind::Event).ok().map(|ev| ev.id)
    }

    fn keep_event_callback(&self, conn: &Conn, pfn: EventNotifyFn, user_data: usize, event: usize) -> bool {
        crate::recovery::keep_event_callback(conn.serial(), pfn, user_data, event)
    }

    fn released(&self, conn: &Conn, id: ObjectId) {
        crate::recovery::journal_of(conn).released(id);
    }

    fn await_restarts(&self) -> bool {
        super::await_restarts()
    }

    fn dispatch(&self) -> &'static IcdDispatch {
        &crate::DISPATCH
    }

    fn timing(&self) -> bool {
        crate::intercept::timing_on()
    }

    fn worker_time(&self, worker_ns: u64, waited: std::time::Duration) {
        crate::intercept::note_worker_time(worker_ns, waited);
    }

    fn unfinished(&self, conn: &Conn, event: ObjectId) {
        crate::recovery::journal_of(conn).unfinished(event);
    }
}
