//! Events: waits, user events, callbacks.

use super::*;

impl Serve<EventStatuses> for LaneServer<'_> {
    fn serve(&self, r: EventStatuses) -> StatusesReply {
        // Every status first, then the releases (an id may be asked twice).
        let asked: Vec<(Option<usize>, i32)> = r
            .events
            .iter()
            .map(|&id| match self.obj(id, Kind::Event) {
                Ok(ev) => (Some(ev), event_status(ev).unwrap_or_else(|e| e)),
                Err(_) => (None, CL_INVALID_EVENT),
            })
            .collect();
        for (&id, &(ev, status)) in r.events.iter().zip(&asked) {
            let Some(ev) = ev.filter(|_| status <= CL_COMPLETE && status != CL_INVALID_EVENT) else { continue };
            // Complete or failed: its callbacks go now (see `notify::event_reached`).
            notify::event_reached(ev, status);
            if r.release_settled.contains(&id) {
                self.serve(Release { object: id });
            }
        }
        StatusesReply { status: CL_SUCCESS, statuses: asked.into_iter().map(|(_, status)| status).collect() }
    }
}

impl Serve<EventProfiles> for LaneServer<'_> {
    fn serve(&self, r: EventProfiles) -> ProfilesReply {
        let profile = |id| {
            let ev = match self.obj(id, Kind::Event) {
                Ok(ev) => ev,
                Err(e) => return EventProfile { status: e, times: None },
            };
            let status = event_status(ev).unwrap_or_else(|e| e);
            if status > CL_COMPLETE {
                return EventProfile { status, times: None };
            }
            // Complete or failed: its callbacks go now (see `notify::event_reached`).
            notify::event_reached(ev, status);
            let time = |param| {
                let mut t = 0u64;
                let (size, ptr) = (std::mem::size_of::<u64>(), (&mut t as *mut u64).cast());
                (info_call(InfoTarget::EventProfiling, ev, 0, param, size, ptr, null_mut()) == CL_SUCCESS).then_some(t)
            };
            let times = match status {
                CL_COMPLETE => time(CL_PROFILING_COMMAND_START).zip(time(CL_PROFILING_COMMAND_END)),
                _ => None,
            };
            EventProfile { status, times }
        };
        ProfilesReply { status: CL_SUCCESS, profiles: r.events.iter().map(|&id| profile(id)).collect() }
    }
}

impl Serve<WaitForEvents> for LaneServer<'_> {
    fn serve(&self, r: WaitForEvents) -> i32 {
        let evs = tri!(self.objs(&r.events, Kind::Event, CL_INVALID_EVENT));
        let Some(&first) = evs.first() else {
            return CL_INVALID_VALUE;
        };
        // SAFETY: live events.
        let rc = unsafe { driver_fn!(first as usize, clWaitForEvents)(evs.len() as u32, evs.as_ptr()) };
        if rc == CL_SUCCESS {
            // Every one is complete: their callbacks go now, not when the driver gets to them.
            for &ev in &evs {
                notify::event_reached(ev as usize, CL_COMPLETE);
            }
        }
        rc
    }
}

impl Serve<CreateUserEvent> for LaneServer<'_> {
    fn serve(&self, r: CreateUserEvent) -> i32 {
        let ctx = tri!(self.obj(r.context, Kind::Context));
        let mut rc = CL_SUCCESS;
        // SAFETY: live context.
        let ev = unsafe { driver_fn!(ctx, clCreateUserEvent)(ctx as _, &mut rc) };
        self.adopt(r.id, Kind::Event, ev, rc)
    }
}

impl Serve<SetUserEventStatus> for LaneServer<'_> {
    fn serve(&self, r: SetUserEventStatus) -> i32 {
        let ev = tri!(self.obj(r.event, Kind::Event));
        if self.stand_in_of(ev).is_some() {
            // The application's handle is a command's event, not a user event of its own.
            return CL_INVALID_EVENT;
        }
        // SAFETY: live event.
        let rc = unsafe { driver_fn!(ev, clSetUserEventStatus)(ev as _, r.status) };
        if rc == CL_SUCCESS {
            // A user event is at the status it was just given: its callbacks go now, whether
            // or not the driver calls them (pocl calls none for a negative status, which the
            // CTS's `callback_on_error_simple` checks). Each goes once (`notify`).
            notify::event_reached(ev, r.status);
        }
        rc
    }
}

/// The event of a transfer the shim made itself: a user event of the queue's context, complete
/// now, standing in for the transfer's command on `queue` (see `EnqueueDone`). Posted: a
/// failure makes the event a failed one and is the queue's late error (`late_failure`).
impl Serve<EnqueueDone> for LaneServer<'_> {
    fn serve(&self, r: EnqueueDone) -> i32 {
        let q = tri!(self.obj(r.queue, Kind::Queue));
        let Some(id) = r.sync.event else { return CL_SUCCESS };
        if !r.sync.wait.is_empty() {
            return CL_INVALID_EVENT_WAIT_LIST;
        }
        let Some(ctx) = super::queue_context(q) else { return CL_INVALID_COMMAND_QUEUE };
        let ev = tri!(user_event_at(ctx, CL_COMPLETE));
        self.note_stand_in(ev as usize, super::StandIn { command_type: r.command_type, queue: q });
        self.adopt(id, Kind::Event, ev, CL_SUCCESS)
    }
}

/// A user event of context `ctx` with its status set to `status`: what stands for a command the
/// shim made itself (complete) or for one the driver refused after the call had returned (the
/// refusal's code, `LaneServer::late_failure`).
pub(super) fn user_event_at(ctx: usize, status: cl_int) -> Result<*mut c_void, cl_int> {
    // SAFETY: `ctx` is a live context handle of the driver's.
    let table = unsafe { crate::driver::dispatch(ctx) };
    let (Some(create), Some(set), Some(release)) =
        (table.clCreateUserEvent, table.clSetUserEventStatus, table.clReleaseEvent)
    else {
        return Err(CL_INVALID_OPERATION);
    };
    let mut rc = CL_SUCCESS;
    // SAFETY: a live context.
    let ev = unsafe { create(ctx as _, &mut rc) };
    if rc != CL_SUCCESS || ev.is_null() {
        return Err(if rc == CL_SUCCESS { CL_OUT_OF_RESOURCES } else { rc });
    }
    // SAFETY: the user event just created.
    let set = unsafe { set(ev, status) };
    if set != CL_SUCCESS {
        // SAFETY: as above; nobody else holds it.
        unsafe { release(ev) };
        return Err(set);
    }
    Ok(ev)
}

impl Serve<SetEventCallback> for LaneServer<'_> {
    fn serve(&self, r: SetEventCallback) -> i32 {
        let ev = tri!(self.obj(r.event, Kind::Event));
        notify::await_event_callback(ev, r.token, r.callback_type);
        // SAFETY: live event; the callback has the signature clSetEventCallback expects and
        // `token` is an opaque integer, never dereferenced.
        let rc = unsafe {
            driver_fn!(ev, clSetEventCallback)(
                ev as _,
                r.callback_type,
                notify::on_event_status as *mut c_void,
                r.token as *mut c_void,
            )
        };
        if rc != CL_SUCCESS {
            notify::take_event_callback(r.token);
        }
        rc
    }
}
