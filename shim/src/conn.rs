//! A connection to one worker: the socket (bootstrap, fds, notifications, death detection), one
//! lane per application thread, and the callbacks the application registered.
//!
//! Layer: the transport, above only the leaves. It imports `base` and `stdio_relay` (and its
//! own `spill`), never the handle table, pending transfers, recovery, the runtime or
//! `intercept`: what it must ask of them goes through `Above`, handed to `Conn::connect`, and
//! what they keep per connection lives in `Conn::state`, whose types only they name.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock, Weak};

use crate::base::RecoveryMode;

use cloister_ipc::cl::*;
use cloister_ipc::dispatch::IcdDispatch;
use cloister_ipc::fast_hash::FastMap;
use cloister_ipc::handshake::Hello;
use cloister_ipc::lane::{Lane, PostError, Spin, WaitEnd};
use cloister_ipc::shm::SharedRegion;
use cloister_ipc::{
    channel, decode_reply, BufferMemory, Call, Enumerated, Notification, ObjectId, ObjectKind, Request, ShimMessage,
    WorkerMessage,
};

mod shared_view;
mod slabs;
mod spill;

pub use shared_view::{BufferPlace, SharedView};
pub use slabs::SLAB_ITEM_MAX;

pub type ContextNotifyFn = unsafe extern "C" fn(*const c_char, *const c_void, usize, *mut c_void);
pub type BuildNotifyFn = unsafe extern "C" fn(cl_program, *mut c_void);
pub type EventNotifyFn = unsafe extern "C" fn(cl_event, cl_int, *mut c_void);

/// An application callback waiting for a notification from the worker. None runs after the
/// object it belongs to is gone: a context's is unregistered when the application releases the
/// context (`handle::Object::own_callback`); a build's and an event's hold a reference to the
/// program or event (taken at registration, dropped once the callback has run or is dropped),
/// as the spec has the implementation keep them until their callbacks have run.
pub enum Callback {
    Context {
        pfn: ContextNotifyFn,
        user_data: usize,
    },
    Build {
        pfn: BuildNotifyFn,
        user_data: usize,
        program: usize,
    },
    Event {
        pfn: EventNotifyFn,
        user_data: usize,
        event: usize,
    },
    /// The shim's own, run on the notifier once an event completes (with its status, after the
    /// finished transfers have landed), or with `FAULT` when the worker dies.
    Shim(ShimCallback),
}

/// What `Callback::Shim` runs.
pub type ShimCallback = Box<dyn FnOnce(&Conn, cl_int) + Send>;

pub struct Conn {
    serial: u64,
    pub driver: String,
    /// The hang deadlines in effect for this driver (the shim waits a grace longer).
    deadlines: cloister_ipc::deadlines::Deadlines,
    /// The sandbox profile the worker runs under, and the state of each of its layers.
    pub profile: String,
    pub layers: Vec<String>,
    sock: OwnedFd,
    send_lock: Mutex<()>,
    /// Shared with this connection's lanes, so a thread can drop the lanes of dead workers.
    dead: Arc<AtomicBool>,
    next_id: AtomicU64,
    ids: RwLock<FastMap<ObjectId, usize>>,
    callbacks: Mutex<FastMap<u64, Callback>>,
    /// Event callbacks registered in `callbacks` or being run by the notifier: while there are
    /// none, a wait on the worker has no callback to wait for (`await_completed_callbacks`), and
    /// it costs a load instead of three locks, a clock read and the thread's name (a
    /// `clFinish` round trip's own work, after the reply).
    event_callbacks: AtomicUsize,
    /// Signalled when a build callback has run (its token leaves `callbacks` afterwards).
    build_callback_ran: Condvar,
    /// The context callback the notifier is running now, so a release waits for it to return
    /// (after `clReleaseContext` returns, the callback never runs); `context_ran` signals it.
    running_context: Mutex<Option<u64>>,
    context_ran: Condvar,
    /// Set while the notifier handles a message it took off the socket; `delivered` signals
    /// when it is done (see `await_completed_callbacks`).
    delivering: Mutex<bool>,
    delivered: Condvar,
    /// Messages the notifier has handled, counted after `delivering` is cleared: a wait for a
    /// callback spins on it (`await_notifier`) without taking the notifier's locks.
    deliveries: AtomicU64,
    /// How long the notifier polls its socket before it sleeps, and a wait for a callback spins
    /// before it sleeps (`Spin`, as the lanes' waits): a callback per command (a framework that
    /// tracks each command by one) otherwise paid two wake-ups of a sleeping thread per command,
    /// the notifier's and the waiting application's, 10-30 us each on a VM whose idle vCPU halted.
    notifier_spin: Spin,
    callback_spin: Spin,
    /// Set once the contexts have heard of the worker's death; `death_told_cv` signals it.
    death_told: Mutex<bool>,
    death_told_cv: Condvar,
    /// Shared segments not in use, kept mapped on both sides for the next transfer or map.
    segment_pool: Mutex<Vec<Segment>>,
    /// Pooled segments whose contents a posted request still has to read (`post_with_segment`),
    /// with the lane and mark of the post: back to the pool once it has run.
    held_segments: Mutex<Vec<(Arc<Lane>, u32, Segment)>>,
    /// Slabs that small zero-copy buffers are carved out of (`buffer_memory`).
    slabs: slabs::Slabs,
    /// Told when the worker dies (the runtime starts a replacement).
    pub death_watcher: OnceLock<Arc<dyn DeathWatcher>>,
    /// Every lane ever opened, so a death can wake the threads sleeping on them at once.
    lanes: Mutex<Vec<Weak<Lane>>>,
    /// The first lane that posted a request (its address; 0: none yet), and whether another
    /// one has since: while only one thread posts, the others' calls need not look at it.
    first_poster: AtomicUsize,
    many_posters: AtomicBool,
    /// Whether a kernel of this worker may call `printf` (`stdio_relay::may_print`): only then
    /// does a call that waits for the device look for output in the relay's pipes before it
    /// returns (two `read`s, 2 us a call on the H100's VM, for output that is almost never there).
    may_print: AtomicBool,
    /// (platform handle, its device handles), in the worker's order.
    pub platforms: OnceLock<Vec<(usize, Vec<usize>)>>,
    /// Under `CLOISTER_RECOVERY=auto`: whether this worker is replayed, once settled
    /// (`replays`).
    replay_settled: OnceLock<bool>,
    /// What the layers above keep for this connection (`state`): `pending`'s transfers,
    /// `recovery`'s journal. Made on first use, dropped with the connection.
    states: [OnceLock<Box<dyn Any + Send + Sync>>; STATE_SLOTS],
    /// The layers above, as this connection reaches them.
    above: &'static dyn Above,
}

/// How many kinds of state the layers above may keep per connection (`Conn::state`): two are
/// (`pending::Pending`, `recovery::Journal`).
const STATE_SLOTS: usize = 4;

/// The layers above the transport, as the layers below them reach them: the transport (the
/// notifier's callbacks, a new worker's handles, the timing report), the handle table (the
/// dispatch table, releases, restarts) and pending
/// transfers (failed reads) call up only through this, so none of them imports what is above
/// it. Implemented once at the top (`runtime::LAYERS`) and handed to `Conn::connect`, so no
/// connection runs without it.
pub trait Above: Send + Sync {
    /// Makes the handles for the platforms and devices a new worker announced, before any of
    /// its messages is handled; those of `reuse` (the worker it replaces) are rebound to it by
    /// position. Returns (platform handle, its device handles), in the worker's order.
    fn adopt(
        &self,
        conn: &Arc<Conn>,
        platforms: &[ObjectId],
        devices: &[Enumerated],
        reuse: Option<&[(usize, Vec<usize>)]>,
    ) -> Vec<(usize, Vec<usize>)>;
    /// Lands this connection's finished transfers (`pending::settle`): a callback that hears
    /// of an event's completion, or of the worker's death, finds the data in place.
    fn settle(&self, conn: &Conn);
    /// Drops the reference a callback held on the application's program or event (taken at
    /// registration, see `Callback`).
    fn release(&self, handle: usize, kind: ObjectKind);
    /// The worker's id of the application's event `handle`, if that is a live event.
    fn event_id(&self, handle: usize) -> Option<ObjectId>;
    /// An event callback still waiting when its worker died: whether it is kept for the
    /// event's command rebuilt in a replacement (replay mode), instead of failing now.
    fn keep_event_callback(&self, conn: &Conn, pfn: EventNotifyFn, user_data: usize, event: usize) -> bool;
    /// The handle table's word, in replay mode: the application's last reference to object
    /// `id` of this worker went.
    fn released(&self, conn: &Conn, id: ObjectId);
    /// The handle table's question when a platform or device's worker died: waits (a bounded
    /// while) for the replacements under way; whether one was.
    fn await_restarts(&self) -> bool;
    /// The ICD dispatch table a new handle begins with (the entry points, at the crate's root).
    fn dispatch(&self) -> &'static IcdDispatch;
    /// Whether lane calls ask the worker for its own time (`spill`; the timing report of
    /// `intercept` is on).
    fn timing(&self) -> bool;
    /// A timed reply said the worker spent `worker_ns` on it; the shim waited `waited` for it.
    fn worker_time(&self, worker_ns: u64, waited: std::time::Duration);
    /// Pending transfers' word, in replay mode: the non-blocking read or map whose event is
    /// `event` never landed (recovery must not call that event complete).
    fn unfinished(&self, conn: &Conn, event: ObjectId);
}

/// A lane owned by the current thread; closing it on thread exit ends the worker's thread.
struct LaneSlot {
    lane: Arc<Lane>,
    /// The connection's death flag: a dead worker's lanes are dropped on the thread's next call.
    dead: Arc<AtomicBool>,
    /// How long the ring may take to drain when the thread goes (the driver's `other` deadline).
    drain_ms: u64,
}

impl Drop for LaneSlot {
    /// The thread is gone, but what it posted still runs before anything another thread asks
    /// afterwards (see `Conn::after_other_lanes`): its ring drains before the lane closes.
    fn drop(&mut self) {
        let dead = &self.dead;
        if !dead.load(Ordering::Acquire) {
            let deadline = std::time::Instant::now() + std::time::Duration::from_millis(self.drain_ms);
            let _ = self.lane.wait_drained(&|| !dead.load(Ordering::Acquire) && std::time::Instant::now() < deadline);
        }
        self.lane.close();
    }
}

/// `CLOISTER_SYNC=1`: strict mode, every enqueue and buffer creation waits for its reply
/// (errors come from the call).
pub fn strict() -> bool {
    static STRICT: OnceLock<bool> = OnceLock::new();
    *STRICT.get_or_init(cloister_ipc::settings::sync_mode)
}

thread_local! {
    /// Whether the enqueue this thread is making waits for an event of another context
    /// (`api::enqueue_sync` says so for each enqueue, and a command the shim makes itself says
    /// it does not: `api::enqueue`'s `done_event`). OpenCL refuses that with
    /// `CL_INVALID_CONTEXT`, pocl in every enqueue but `clEnqueueNDRangeKernel`, which runs it:
    /// such an enqueue is never posted, so that its call returns what the driver says.
    static WAITS_ACROSS_CONTEXTS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Notes whether the enqueue this thread is making waits for an event of another context
/// (see `WAITS_ACROSS_CONTEXTS`).
pub fn waits_across_contexts(yes: bool) {
    WAITS_ACROSS_CONTEXTS.with(|w| w.set(yes));
}

/// The deadline of one wait on the worker: the call's class deadline plus a grace, later than
/// the broker's watchdog (which kills a stuck worker and writes the report), as the backstop for
/// a worker the watchdog cannot see.
struct Deadline {
    name: &'static str,
    ms: u64,
    at: std::time::Instant,
    passed: std::cell::Cell<bool>,
}

impl Deadline {
    fn for_op(conn: &Conn, name: &'static str) -> Self {
        let ms = conn.deadlines.for_op(name) + SHIM_GRACE_MS;
        let at = std::time::Instant::now() + std::time::Duration::from_millis(ms);
        Deadline { name, ms, at, passed: std::cell::Cell::new(false) }
    }

    /// Whether waiting on the worker still makes sense.
    fn alive(&self, conn: &Conn) -> bool {
        self.passed.set(std::time::Instant::now() >= self.at);
        !conn.is_dead() && !self.passed.get() && !conn.hung_up()
    }
}

thread_local! {
    static LANES: RefCell<FastMap<u64, Rc<LaneSlot>>> = RefCell::new(FastMap::default());
}

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The serial of a dead worker this thread's current call met (see `recovery::retrying`).
    static MET_DEATH: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// This thread's buffers for a call's encoded request and its reply (`Conn::exchange`).
#[derive(Default)]
struct CallBuffers {
    request: Vec<u8>,
    reply: Vec<u8>,
}

thread_local! {
    /// This thread's buffer for encoding posted requests (`Conn::post_request`), so a stream of
    /// posted enqueues encodes without allocating.
    static POST_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static CALL_BUFFERS: RefCell<CallBuffers> = RefCell::new(CallBuffers::default());
}

/// Runs `f` with this thread's `scratch`; one nested in another use of it (it is borrowed) or on
/// a thread going away gets a fresh one. One thread-local access (calls and posts are hot paths).
fn with_scratch<T: Default + 'static, R>(
    scratch: &'static std::thread::LocalKey<RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    let mut f = Some(f);
    let ran = scratch.try_with(|b| {
        let mut b = b.try_borrow_mut().ok()?;
        f.take().map(|f| f(&mut b))
    });
    match (ran, f) {
        (Ok(Some(r)), _) => r,
        (_, Some(f)) => f(&mut T::default()),
        (_, None) => unreachable!("`f` is taken only when it ran"),
    }
}

/// A call on this thread failed because worker `serial` is dead.
pub fn met_death(serial: u64) {
    DEATHS_MET.store(true, Ordering::Relaxed);
    let _ = MET_DEATH.try_with(|m| m.set(Some(serial)));
}

/// Set once any call met its worker's death: until then `recovery::retrying` skips the
/// thread-local (in a library the loader opened, each access is a `__tls_get_addr` call). A
/// thread sees its own `met_death` in program order, which is all `recovery::retrying` needs.
static DEATHS_MET: AtomicBool = AtomicBool::new(false);

/// Whether any call of the process has met its worker's death (see `DEATHS_MET`).
#[inline(always)]
pub fn any_death_met() -> bool {
    DEATHS_MET.load(Ordering::Relaxed)
}

/// This thread's death met since the last take, if any (`recovery::retrying` asks only once
/// `any_death_met`).
pub fn take_met_death() -> Option<u64> {
    MET_DEATH.try_with(|m| m.take()).ok().flatten()
}

thread_local! {
    /// Set while this thread holds a lock the notifier may need before it tells the contexts
    /// of a death (`pending`'s settling lock): its failing calls must not wait for the notifier.
    static HOLDS_NOTIFIER_LOCK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread holds a lock the notifier may need (see `HoldsNotifierLock`).
fn holds_notifier_lock() -> bool {
    HOLDS_NOTIFIER_LOCK.try_with(|s| s.get()).unwrap_or(false)
}

/// Marks this thread, while it lives, as holding a lock the notifier may need: its calls then
/// never wait for the notifier (`await_death_told`, `await_completed_callbacks`). Nested marks
/// restore the outer one's.
pub struct HoldsNotifierLock {
    outer: bool,
}

impl HoldsNotifierLock {
    pub fn enter() -> Self {
        let outer = HOLDS_NOTIFIER_LOCK.try_with(|s| s.replace(true)).unwrap_or(false);
        HoldsNotifierLock { outer }
    }
}

impl Drop for HoldsNotifierLock {
    fn drop(&mut self) {
        let _ = HOLDS_NOTIFIER_LOCK.try_with(|s| s.set(self.outer));
    }
}

/// Who restarts a dead worker. `dying` runs before anything learns of the death, so a thread
/// that then looks for the replacement waits for it; `died` runs after the cleanup.
pub trait DeathWatcher: Send + Sync {
    fn dying(&self);
    /// The broker's account of the death (cause and report), if it has one.
    fn account(&self) -> Option<String>;
    /// Starts the replacement (or not, for a crash loop). It is given the notifier's own
    /// reference to the dead connection, to drop before it announces the replacement: the dead
    /// worker's socket and memory are then gone when a waiting thread goes on (unless the
    /// application still holds something of it), so a restart's fd count is the same each time.
    fn died(&self, dead: Arc<Conn>);
}

/// A shared-memory segment for bulk data, mapped here and in the worker under `id`. The
/// region is shared with replay's journal when it keeps a write's data where the write staged
/// it (`Segment::kept`): the pool does not hand it out again while the journal holds it.
pub struct Segment {
    pub id: u64,
    pub region: Arc<SharedRegion>,
}

impl Segment {
    /// The staged bytes `[at, at + len)` of the segment, kept by whoever holds them: the pool
    /// does not reuse the segment until they are dropped (the shim's mapping lives as long).
    pub fn kept(&self, at: usize, len: usize) -> Option<cloister_ipc::shm::KeptBytes> {
        cloister_ipc::shm::KeptBytes::new(Arc::clone(&self.region), at, len)
    }

    /// Whether something still holds bytes of it (`kept`).
    fn is_kept(&self) -> bool {
        Arc::strong_count(&self.region) > 1
    }
}

/// The notifier thread's name (callbacks run on it).
const NOTIFIER: &str = "cloister-notify";

/// How much longer than the watchdog's deadline the shim waits for an answer.
const SHIM_GRACE_MS: u64 = 2000;

/// How long a wait gives the event callbacks due before it returns (`await_completed_callbacks`),
/// and how many waiting callbacks it looks at.
const CALLBACK_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
const MAX_AWAITED: usize = 64;

/// Whether a call returns only once commands completed: a wait, a finish or a blocking
/// transfer or map (its event's callbacks then run before it returns, see
/// `Conn::await_completed_callbacks`).
fn waits_for_completion(req: &cloister_ipc::Request) -> bool {
    use cloister_ipc::Request as R;
    match req {
        R::WaitForEvents(_) => true,
        R::FlushOrFinish(r) => r.finish,
        R::EnqueueReadBuffer(r) => r.blocking,
        R::EnqueueWriteBuffer(r) => r.blocking,
        R::EnqueueMapBuffer(r) => r.blocking,
        R::EnqueueRegionTransfer(r) => r.blocking,
        R::EnqueueMapImage(r) => r.blocking,
        _ => false,
    }
}

/// The smallest shared segment made for a transfer.
pub const SEGMENT_MIN: usize = 64 << 10;

/// How much unused segment memory a connection keeps for reuse.
const SEGMENT_POOL_BYTES: usize = 256 << 20;

/// Pooled segments posted requests may hold at once (`Conn::spare_segment`).
const MAX_HELD_SEGMENTS: usize = 8;

/// How `Conn::post_marked` sent a request.
enum Sent {
    /// Posted on this thread's lane, with its mark (`Lane::has_run`). The slot, not a new
    /// reference to the lane: most posts drop it at once, and a reference count is two locked
    /// instructions on every enqueue.
    Posted(Rc<LaneSlot>, u32),
    /// As a call (strict mode, not postable, too large for the ring), with its answer.
    Called(cl_int),
}

/// The error every call on a dead or misbehaving worker gets.
pub const FAULT: cl_int = CL_DEVICE_NOT_AVAILABLE;

/// The error for objects of two different workers used together: `err` as the driver would
/// say it, unless one of the two workers died, which is what happened to the application (an
/// object of the lost context met a device already rebound to the replacement): then the
/// fault every call on a dead worker gets, as the README promises.
pub fn mismatch(a: &Conn, b: &Conn, err: cl_int) -> cl_int {
    if a.is_dead() || b.is_dead() {
        FAULT
    } else {
        err
    }
}

/// Most platforms and devices one worker may announce. One driver enumerates a handful; a
/// welcome beyond these is a hostile worker making the shim allocate and loop without end.
pub const MAX_PLATFORMS: usize = 16;
pub const MAX_DEVICES: usize = 1024;

/// Checks a welcome's lists before anything is built from them: bounded, no id twice, and
/// every device on an announced platform.
fn check_welcome(platforms: &[ObjectId], devices: &[cloister_ipc::Enumerated]) -> Result<(), String> {
    if platforms.len() > MAX_PLATFORMS || devices.len() > MAX_DEVICES {
        return Err(format!(
            "announced {} platforms and {} devices (at most {MAX_PLATFORMS} and {MAX_DEVICES})",
            platforms.len(),
            devices.len()
        ));
    }
    let mut seen = std::collections::HashSet::new();
    let all = platforms.iter().chain(devices.iter().map(|d| &d.id));
    if !all.into_iter().all(|id| seen.insert(*id)) {
        return Err("announced an id twice".into());
    }
    if devices.iter().any(|d| !platforms.contains(&d.platform)) {
        return Err("announced a device of no announced platform".into());
    }
    Ok(())
}

/// The fewest cores on which the notifier polls its socket before it sleeps (`Conn::await_message`).
const NOTIFIER_SPIN_CORES: usize = 4;

impl Conn {
    /// Greets the worker behind `sock` and builds handles for what it enumerated.
    /// With `reuse`, the platform and device handles of the worker this one replaces are
    /// rebound to it (matched by position: the same driver enumerates in the same order).
    /// `above` is how the layers above are reached from this connection (`Above`).
    pub fn connect(
        sock: OwnedFd,
        driver: &str,
        reuse: Option<&[(usize, Vec<usize>)]>,
        above: &'static dyn Above,
    ) -> Result<Arc<Conn>, String> {
        channel::send(&sock, &ShimMessage::Hello(Hello::new()), &[]).map_err(|e| e.to_string())?;
        // The worker loads and enumerates its driver before it answers: a driver that hangs
        // there is killed by the broker's watchdog at the deadline of `Initialize`; this is the
        // backstop for a worker the watchdog cannot see.
        // The driver's own deadlines, when its section of the configuration sets them.
        let deadlines = cloister_ipc::deadlines::Deadlines::for_driver(Some(driver));
        let deadline_ms = deadlines.for_op(cloister_ipc::deadlines::INITIALIZE) + SHIM_GRACE_MS;
        if !channel::readable_within(&sock, std::time::Duration::from_millis(deadline_ms)) {
            return Err(format!("the worker for {driver} did not answer its welcome within {deadline_ms} ms"));
        }
        let (msg, _) = channel::recv::<WorkerMessage>(&sock).map_err(|e| format!("worker for {driver}: {e}"))?;
        let (platforms, devices, profile, layers) = match msg {
            WorkerMessage::Welcome { version, platforms, devices, profile, layers, .. } => {
                if version != cloister_ipc::handshake::PROTOCOL_VERSION {
                    return Err(format!("worker for {driver} speaks protocol v{version}"));
                }
                check_welcome(&platforms, &devices).map_err(|e| format!("worker for {driver} {e}"))?;
                (platforms, devices, profile, layers)
            }
            WorkerMessage::Refused { reason } => return Err(format!("worker for {driver} refused: {reason}")),
            WorkerMessage::Notify(_) => return Err(format!("worker for {driver}: unexpected message")),
        };
        let conn = Arc::new(Conn {
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            driver: driver.to_string(),
            deadlines,
            profile,
            layers,
            sock,
            send_lock: Mutex::new(()),
            dead: Arc::new(AtomicBool::new(false)),
            next_id: AtomicU64::new(1),
            ids: RwLock::new(FastMap::default()),
            callbacks: Mutex::new(FastMap::default()),
            event_callbacks: AtomicUsize::new(0),
            build_callback_ran: Condvar::new(),
            running_context: Mutex::new(None),
            context_ran: Condvar::new(),
            delivering: Mutex::new(false),
            delivered: Condvar::new(),
            deliveries: AtomicU64::new(0),
            notifier_spin: Spin::default(),
            callback_spin: Spin::default(),
            death_told: Mutex::new(false),
            death_told_cv: Condvar::new(),
            segment_pool: Mutex::new(Vec::new()),
            held_segments: Mutex::new(Vec::new()),
            slabs: slabs::Slabs::default(),
            lanes: Mutex::new(Vec::new()),
            first_poster: AtomicUsize::new(0),
            many_posters: AtomicBool::new(false),
            may_print: AtomicBool::new(false),
            death_watcher: OnceLock::new(),
            platforms: OnceLock::new(),
            replay_settled: OnceLock::new(),
            states: Default::default(),
            above,
        });
        let table = above.adopt(&conn, &platforms, &devices, reuse);
        let _ = conn.platforms.set(table);
        let notifier = conn.clone();
        std::thread::Builder::new()
            .name(NOTIFIER.into())
            .spawn(move || notifier.notification_loop())
            .map_err(|e| e.to_string())?;
        Ok(conn)
    }

    /// This connection's state of type `T`, which a layer above keeps here (`pending::of`,
    /// `recovery::journal_of`): made with `T::default()` on first use, dropped with the
    /// connection. One value per type; only the layer that owns `T` names it.
    pub fn state<T: Default + Send + Sync + 'static>(&self) -> &T {
        for slot in &self.states {
            if let Some(t) = slot.get_or_init(|| Box::new(T::default())).downcast_ref::<T>() {
                return t;
            }
        }
        // A programming error (a new kind of state without a slot), which any test meets.
        panic!("more kinds of per-connection state than STATE_SLOTS ({STATE_SLOTS})");
    }

    /// The layers above, as this connection reaches them.
    pub fn above(&self) -> &'static dyn Above {
        self.above
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// This connection's number in this process.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// This thread's call failed because this worker is dead: in replay mode it runs again once
    /// the objects are carried over (`recovery::retrying`); in report mode it fails at once.
    fn met_its_death(&self) {
        if self.replays() {
            met_death(self.serial);
        }
    }

    /// Whether this worker's objects are recorded and rebuilt after its death (replay
    /// recovery): always under `CLOISTER_RECOVERY=replay`, never under `report`, and under
    /// `auto` once `settle_replay` said so.
    pub fn replays(&self) -> bool {
        match crate::base::recovery_mode() {
            RecoveryMode::Report => false,
            RecoveryMode::Replay => true,
            RecoveryMode::Auto => self.replay_settled.get() == Some(&true),
        }
    }

    /// Under `auto`, settles (once) whether this worker is replayed; `replayed` is asked only
    /// then.
    pub fn settle_replay(&self, replayed: impl FnOnce() -> bool) {
        if crate::base::recovery_mode() == RecoveryMode::Auto && self.replay_settled.get().is_none() {
            let _ = self.replay_settled.set(replayed());
        }
    }

    /// Allocates ids after those of `old`, which this worker replaces: its objects are
    /// rebuilt here under their own ids (`recovery`).
    pub fn continue_ids_from(&self, old: &Conn) {
        self.next_id.fetch_max(old.next_id.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Cuts the channel: the worker sees EOF, and our notifier thread runs the death handling.
    pub(crate) fn hang_up(&self) {
        // Flag the restart before anyone can see this worker dead (as the notifier does).
        if let Some(w) = self.death_watcher.get() {
            w.dying();
        }
        // SAFETY: shutdown on our own socket; the fd stays valid until the Conn is dropped.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// A call that met the worker's death returns once the contexts have heard of it (their
    /// callbacks run on the notifier thread), boundedly: directly, a driver reports the error
    /// to the context before the failing call returns, and the application, which may release
    /// the context right after, must have heard by then.
    fn await_death_told(&self) {
        // The notifier itself, and a thread holding the lock the notifier settles under, go on
        // at once (the contexts may then hear after the call returned, never after a release).
        if std::thread::current().name() == Some(NOTIFIER) || holds_notifier_lock() {
            return;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut told = self.death_told.lock().unwrap_or_else(|e| e.into_inner());
        while !*told {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            told = self.death_told_cv.wait_timeout(told, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Whether the worker's end of the socket is gone. The notifier sees that too, but not
    /// while it is itself waiting on a call (a callback's, or an event's release): then this
    /// is how that call, and every other, learns of the death.
    fn hung_up(&self) -> bool {
        let mut p = libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: one valid pollfd for our own open socket; a zero timeout does not block.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
    }

    fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    pub fn alloc_id(&self) -> ObjectId {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn remember(&self, id: ObjectId, handle: usize) {
        self.ids.write().unwrap_or_else(|e| e.into_inner()).insert(id, handle);
    }

    pub fn forget(&self, id: ObjectId) {
        self.ids.write().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// The handle for an id the worker returned; NULL for ids the application never saw.
    pub fn handle_of(&self, id: ObjectId) -> u64 {
        self.ids.read().unwrap_or_else(|e| e.into_inner()).get(&id).map_or(0, |&h| h as u64)
    }

    fn send(&self, msg: &ShimMessage, fds: &[i32]) -> Result<(), cl_int> {
        let _g = self.send_lock.lock().unwrap_or_else(|e| e.into_inner());
        channel::send(&self.sock, msg, fds).map_err(|_| {
            self.mark_dead();
            self.met_its_death();
            FAULT
        })
    }

    /// This thread's lane to the worker, created on first use.
    fn lane(&self) -> Result<Rc<LaneSlot>, cl_int> {
        let existing = LANES.try_with(|l| l.borrow().get(&self.serial).cloned()).map_err(|_| CL_OUT_OF_RESOURCES)?;
        if let Some(l) = existing {
            return Ok(l);
        }
        // A thread that outlived a worker still holds its lane (20 MiB of mapping and an fd).
        let _ = LANES.try_with(|l| l.borrow_mut().retain(|_, slot| !slot.dead.load(Ordering::Acquire)));
        let lane = Lane::create().map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
        let id = self.alloc_id();
        self.send(&ShimMessage::NewLane { lane: id }, &[lane.region().fd().as_raw_fd()])?;
        let lane = Arc::new(lane);
        {
            let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
            lanes.retain(|l| l.strong_count() > 0);
            lanes.push(Arc::downgrade(&lane));
        }
        let slot = Rc::new(LaneSlot { lane, dead: self.dead.clone(), drain_ms: self.deadlines.other_ms });
        LANES.try_with(|l| l.borrow_mut().insert(self.serial, slot.clone())).map_err(|_| CL_OUT_OF_RESOURCES)?;
        Ok(slot)
    }

    /// Runs a call on this thread's lane and waits for its typed reply.
    pub fn call<C: Call>(&self, req: C) -> Result<C::Reply, cl_int> {
        self.call_with(req, |_| Ok(()), |_, _| ())
    }

    /// Like `call`, with access to the lane's bulk area before the request (`fill`) and after
    /// the reply (`drain`).
    pub fn call_with<C: Call, R>(
        &self,
        req: C,
        fill: impl FnOnce(*mut u8) -> Result<(), cl_int>,
        drain: impl FnOnce(&C::Reply, *mut u8) -> R,
    ) -> Result<C::Reply, cl_int> {
        let slot = self.open_lane()?;
        let lane = &slot.lane;
        fill(lane.bulk_ptr())?;
        let request = req.into_request();
        let waits = waits_for_completion(&request);
        match self.exchange(lane, &request, decode_reply::<C>)? {
            Ok(r) => {
                drain(&r, lane.bulk_ptr());
                if waits {
                    self.await_completed_callbacks();
                }
                Ok(r)
            }
            Err(e) => Err(self.malformed(C::NAME, &e.to_string())),
        }
    }

    /// Sends an enqueue the caller vouched for without waiting for its reply, if it may travel
    /// so (`Request::posted`, not in strict mode): CL_SUCCESS at once, and a failure in the
    /// driver is reported late (the event fails, the context's callback hears it, the queue's
    /// next blocking call returns it). Anything else is an ordinary call.
    pub fn post<C: Call<Reply = cl_int>>(&self, req: C) -> Result<cl_int, cl_int> {
        self.post_request(&req.into_request())
    }

    /// `post` for a request built already (which the caller keeps: replay journals it).
    pub fn post_request(&self, request: &Request) -> Result<cl_int, cl_int> {
        self.post_marked(request).map(|sent| match sent {
            Sent::Posted(..) => CL_SUCCESS,
            Sent::Called(rc) => rc,
        })
    }

    /// `post` of a request whose data lies in `seg`, a pooled segment (`spare_segment`): the
    /// segment goes back to the pool once the worker has run the request, or at once when it
    /// went as a call.
    pub fn post_with_segment<C: Call<Reply = cl_int>>(&self, req: C, seg: Segment) -> Result<cl_int, cl_int> {
        match self.post_marked(&req.into_request())? {
            Sent::Posted(slot, mark) => {
                self.held_segments.lock().unwrap_or_else(|e| e.into_inner()).push((slot.lane.clone(), mark, seg));
                Ok(CL_SUCCESS)
            }
            Sent::Called(rc) => {
                self.release_segment(seg);
                Ok(rc)
            }
        }
    }

    /// A pooled segment of at least `len` bytes for a posted request's data, unless
    /// `MAX_HELD_SEGMENTS` are still held by posts the worker has not run (the caller then
    /// makes a call instead: an application far ahead of its worker gains nothing from more).
    pub fn spare_segment(&self, len: usize) -> Option<Result<Segment, cl_int>> {
        (self.reclaim_held_segments() < MAX_HELD_SEGMENTS).then(|| self.pooled_or_new_segment(len))
    }

    /// Returns to the pool the held segments whose posts have run; how many are still held.
    fn reclaim_held_segments(&self) -> usize {
        let (ran, still_held) = {
            let mut held = self.held_segments.lock().unwrap_or_else(|e| e.into_inner());
            if held.is_empty() {
                return 0;
            }
            let (ran, waiting): (Vec<_>, Vec<_>) =
                std::mem::take(&mut *held).into_iter().partition(|(lane, mark, _)| lane.has_run(*mark));
            *held = waiting;
            (ran, held.len())
        };
        for (_, _, seg) in ran {
            self.release_segment(seg);
        }
        still_held
    }

    /// Posts `request` if it may be posted, else calls it.
    fn post_marked(&self, request: &Request) -> Result<Sent, cl_int> {
        let kind = request.posted();
        // An enqueue's other objects are of its queue's context (the shim checks each it posts,
        // `ObjData::context`), and its wait list's events unless said otherwise here.
        let across =
            matches!(kind, Some(cloister_ipc::Posted::Enqueue { .. })) && WAITS_ACROSS_CONTEXTS.with(|w| w.get());
        if strict() || kind.is_none() || across {
            return self.call_request(request).map(Sent::Called);
        }
        // A release posted from another thread (a language runtime's finalizer) orders nothing
        // of this thread's: it does not make the connection one of many posters, which would cost
        // the eventless writes (`posts_alone`) and every call a look at other lanes.
        let orders = matches!(kind, Some(cloister_ipc::Posted::Enqueue { .. } | cloister_ipc::Posted::Create { .. }));
        let slot = self.open_lane()?;
        let name = request.op_name();
        self.after_other_lanes(&slot.lane, name)?;
        // Started by the first wait for ring space, if any (a post that finds room reads no
        // clock): a post waits for nothing else.
        let deadline = std::cell::OnceCell::new();
        let deadline = || deadline.get_or_init(|| Deadline::for_op(self, name));
        let posted = with_scratch(&POST_BUFFER, |bytes: &mut Vec<u8>| {
            match cloister_ipc::encode_request_into(request, bytes) {
                Ok(()) => Ok(slot.lane.post(bytes, &|| deadline().alive(self))),
                Err(_) => Err(CL_OUT_OF_HOST_MEMORY),
            }
        })?;
        match posted {
            Ok(mark) => {
                if orders {
                    self.note_poster(&slot.lane);
                }
                Ok(Sent::Posted(slot, mark))
            }
            // Too large for the ring (a kernel with kilobytes of arguments): a call.
            Err(PostError::TooLarge) => self.call_request(request).map(Sent::Called),
            // The worker wrote a ring counter that cannot be: a misbehaving worker, cut off.
            Err(PostError::Ended(WaitEnd::Protocol)) => Err(self.reject(name, "a ring tail out of range")),
            Err(PostError::Ended(_)) => Err(self.gave_up(deadline())),
        }
    }

    /// `call` for a request built already whose reply is a bare status: waits for the
    /// application's callbacks as `call` does after a request that waits for completion.
    pub fn call_status(&self, request: &Request) -> Result<cl_int, cl_int> {
        let rc = self.call_request(request)?;
        if waits_for_completion(request) {
            self.await_completed_callbacks();
        }
        Ok(rc)
    }

    /// A call with a bare status for a reply, from an already-built request.
    pub fn call_request(&self, request: &Request) -> Result<cl_int, cl_int> {
        let slot = self.open_lane()?;
        self.exchange(&slot.lane, request, cloister_ipc::decode_status)?
            .map_err(|e| self.malformed(request.op_name(), &e.to_string()))
    }

    /// This thread's lane, or the fault of a dead worker.
    fn open_lane(&self) -> Result<Rc<LaneSlot>, cl_int> {
        if self.is_dead() {
            self.met_its_death();
            self.await_death_told();
            return Err(FAULT);
        }
        self.lane()
    }

    /// Posts `request` as this lane's call, waits for the reply's bytes, up to its deadline,
    /// and hands them to `then` (the request and the reply pass through this thread's kept
    /// buffers: no allocation for either once they have grown).
    fn exchange<R>(&self, lane: &Lane, request: &Request, then: impl FnOnce(&[u8]) -> R) -> Result<R, cl_int> {
        // Timed as the flight recorder notes it (a binary size query is a build).
        let name = cloister_ipc::deadlines::recorded_name(request);
        if crate::stdio_relay::may_print(request) {
            self.may_print.store(true, Ordering::Release);
        }
        self.after_other_lanes(lane, name)?;
        // Too big for the lane, the request or its reply travels through a segment (`spill`).
        let answer = with_scratch(&CALL_BUFFERS, |b: &mut CallBuffers| {
            cloister_ipc::encode_request_into(request, &mut b.request).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
            let trip = |frame: &[&[u8]], reply: &mut Vec<u8>| self.round_trip(lane, frame, reply, name);
            let answer = spill::exchange(self, request.op_name(), &b.request, &mut b.reply, trip, then);
            cloister_ipc::spill::reset_scratch(&mut b.request);
            cloister_ipc::spill::reset_scratch(&mut b.reply);
            answer
        })?;
        if self.may_print.load(Ordering::Acquire)
            && cloister_ipc::deadlines::class_of(name) == cloister_ipc::deadlines::Class::Wait
        {
            // Kernel printf output is in the pipes by now: it reaches the application before
            // the call returns, as it would directly.
            crate::stdio_relay::drain();
        }
        Ok(answer)
    }

    /// Posts one lane frame (given in parts) as this lane's call and waits for the answer's
    /// frame into `reply`, within the deadline of `name`: a worker that never answers (hung
    /// outside any call the broker's watchdog sees, or hostile) is given up on then, like one
    /// that died.
    fn round_trip(&self, lane: &Lane, frame: &[&[u8]], reply: &mut Vec<u8>, name: &'static str) -> Result<(), cl_int> {
        lane.post_request_parts(frame).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
        let deadline = Deadline::for_op(self, name);
        match lane.wait_reply_into(&|| deadline.alive(self), reply) {
            Ok(()) => Ok(()),
            Err(WaitEnd::PeerGone) => Err(self.gave_up(&deadline)),
            // This side closes a lane only once its thread is gone: the worker wrote that (or
            // scribbled over the lane's words), and a live worker that did is cut off.
            Err(WaitEnd::Closed | WaitEnd::Protocol) => Err(self.reject(name, "a lane closed under a call")),
        }
    }

    /// A wait on the worker ended without an answer: past its deadline (the worker is cut off),
    /// or the worker is gone. Returns the call's error once the contexts have heard.
    fn gave_up(&self, deadline: &Deadline) -> cl_int {
        if deadline.passed.get() && !self.is_dead() {
            crate::base::warn(&format!(
                "the worker for {} did not answer {} within {} ms; giving up on it",
                self.driver, deadline.name, deadline.ms,
            ));
            self.hang_up();
        }
        self.mark_dead();
        self.met_its_death();
        self.await_death_told();
        FAULT
    }

    /// A reply we cannot read is a misbehaving worker: a fault, like a crash.
    fn malformed(&self, call: &str, err: &str) -> cl_int {
        crate::base::warn(&format!("worker for {} sent a malformed reply to {call}: {err}", self.driver));
        self.hang_up();
        self.mark_dead();
        self.await_death_told();
        FAULT
    }

    /// This thread's lane, as `first_poster` names lanes (its address); 0 if it has none yet.
    pub fn lane_token(&self) -> usize {
        LANES
            .try_with(|l| l.borrow().get(&self.serial).map(|slot| Arc::as_ptr(&slot.lane) as usize))
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// Whether this thread's lane is the only one that has posted to the worker so far, so the
    /// worker reaches the driver with its posts in the order this thread made them and no other
    /// thread's post in between (see `after_other_lanes`). False before this thread has a lane.
    pub fn posts_alone(&self) -> bool {
        let me = self.lane_token();
        let first = self.first_poster.load(Ordering::Acquire);
        me != 0 && (first == 0 || first == me) && !self.many_posters.load(Ordering::Acquire)
    }

    /// Notes that `lane` has posted (see `first_poster`).
    fn note_poster(&self, lane: &Arc<Lane>) {
        let me = Arc::as_ptr(lane) as usize;
        // The usual case, one thread posting, is a load: no locked instruction per enqueue.
        if self.first_poster.load(Ordering::Acquire) == me {
            return;
        }
        match self.first_poster.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
            Err(first) if first != me => self.many_posters.store(true, Ordering::Release),
            _ => {}
        }
    }

    /// Before a request on `mine`: waits until the worker has taken everything other threads
    /// posted so far. Directly, an enqueue has reached the driver when its call returns, so a
    /// thread told of it (a clFinish, a wait on its event, a release of its buffer) must find
    /// it there; across lanes only this wait gives that order.
    fn after_other_lanes(&self, mine: &Lane, name: &'static str) -> Result<(), cl_int> {
        let first = self.first_poster.load(Ordering::Acquire);
        if first == 0 || (first == mine as *const Lane as usize && !self.many_posters.load(Ordering::Acquire)) {
            return Ok(());
        }
        let others: Vec<Arc<Lane>> = {
            let lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
            lanes.iter().filter_map(Weak::upgrade).filter(|l| !std::ptr::eq(&**l, mine) && !l.is_drained()).collect()
        };
        for lane in others {
            let deadline = Deadline::for_op(self, name);
            lane.wait_drained(&|| deadline.alive(self)).map_err(|_| self.gave_up(&deadline))?;
        }
        Ok(())
    }

    /// A reply that breaks what the application declared (a longer binary than the size it was
    /// told, a count past its array, a pitch the segment was not sized for): the worker is
    /// treated as dead, like one that sent a reply we cannot read. Returns the call's error.
    pub fn reject(&self, call: &str, what: &str) -> cl_int {
        if !self.is_dead() {
            crate::base::warn(&format!("worker for {} answered {call} with {what}; giving up on it", self.driver));
            self.hang_up();
        }
        self.mark_dead();
        self.await_death_told();
        FAULT
    }

    /// A shared segment of at least `len` bytes, known to the worker: a pooled one when one
    /// fits (its pages are already faulted in on both sides), else a fresh one.
    pub fn acquire_segment(&self, len: usize) -> Result<Segment, cl_int> {
        self.reclaim_held_segments();
        self.pooled_or_new_segment(len)
    }

    /// `acquire_segment` once held segments are reclaimed.
    fn pooled_or_new_segment(&self, len: usize) -> Result<Segment, cl_int> {
        // Small transfers share one size, so the pool serves them and its byte limit bounds
        // how many segments (and descriptors) it keeps.
        let len = len.max(SEGMENT_MIN);
        {
            let mut pool = self.segment_pool.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = pool
                .iter()
                .position(|s| s.region.len() >= len && s.region.len() <= len.saturating_mul(2) && !s.is_kept())
            {
                return Ok(pool.swap_remove(i));
            }
        }
        let region = SharedRegion::create("cloister-segment", len).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
        let id = self.share_region(&region)?;
        Ok(Segment { id, region: Arc::new(region) })
    }

    /// Memory for a zero-copy buffer of `len` bytes whose devices want it aligned to `align`
    /// bytes (a power of two; a page at the most, which a segment's start always is): bytes of
    /// a slab for a small buffer, a slab of its own taken again for a larger one (`slabs`), else
    /// a segment of its own. The worker has been sent it; hand it back to `buffer_placed` once
    /// the `CreateBuffer` naming it is answered.
    pub fn buffer_memory(&self, len: usize, align: usize) -> Result<BufferPlace, cl_int> {
        if len <= slabs::WHOLE_SLAB_MAX && align.is_power_of_two() && align <= 4096 {
            let fresh = |bytes: usize| {
                let region = SharedRegion::create("cloister-slab", bytes).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
                Ok::<_, cl_int>((self.share_region(&region)?, region.into_mapping()))
            };
            let placed = match len <= SLAB_ITEM_MAX {
                true => self.slabs.carve(len, align, || fresh(slabs::SLAB_LEN))?,
                false => self.slabs.carve_whole(len, fresh)?,
            };
            if let Some(segment) = placed.retired {
                let _ = self.post(cloister_ipc::RetireSlab { segment });
            }
            for segment in placed.dropped {
                let _ = self.call(cloister_ipc::DropSegment { segment });
            }
            if let Some(carved) = placed.carved {
                let memory = BufferMemory::Slab { segment: carved.segment, offset: carved.offset as u64 };
                let (mapping, offset, lease) = (carved.mapping, carved.offset, Some(carved.lease));
                return Ok(BufferPlace { mapping, offset, memory, lease });
            }
        }
        let region = SharedRegion::create("cloister-buffer", len).map_err(|_| CL_OUT_OF_HOST_MEMORY)?;
        let segment = self.share_region(&region)?;
        let mapping = Arc::new(region.into_mapping());
        Ok(BufferPlace { mapping, offset: 0, memory: BufferMemory::Whole { segment }, lease: None })
    }

    /// The `CreateBuffer` naming `place` was answered (`created`: with success). A segment of
    /// the buffer's own that the worker may not have taken, or a retired slab with nothing in
    /// flight any more, is dropped in the worker.
    pub fn buffer_placed(&self, place: &BufferPlace, created: bool) {
        match place.memory {
            BufferMemory::Whole { segment } if !created => {
                let _ = self.call(cloister_ipc::DropSegment { segment });
            }
            BufferMemory::Whole { .. } => {}
            BufferMemory::Slab { segment, .. } => {
                if let Some(segment) = self.slabs.placed(segment) {
                    let _ = self.post(cloister_ipc::RetireSlab { segment });
                }
            }
        }
    }

    /// Sends the worker a region under a fresh segment id (the fd goes with the message, so
    /// the caller may close its own once this returns).
    pub fn share_region(&self, region: &SharedRegion) -> Result<u64, cl_int> {
        let id = self.alloc_id();
        self.send(&ShimMessage::NewSegment { segment: id }, &[region.fd().as_raw_fd()])?;
        Ok(id)
    }

    /// Returns a segment to the pool, dropping the oldest ones beyond `SEGMENT_POOL_BYTES`.
    pub fn release_segment(&self, seg: Segment) {
        let evicted: Vec<Segment> = {
            let mut pool = self.segment_pool.lock().unwrap_or_else(|e| e.into_inner());
            pool.push(seg);
            let mut total: usize = pool.iter().map(|s| s.region.len()).sum();
            let mut out = Vec::new();
            while total > SEGMENT_POOL_BYTES && pool.len() > 1 {
                let old = pool.remove(0);
                total -= old.region.len();
                out.push(old);
            }
            out
        };
        for old in evicted {
            let _ = self.call(cloister_ipc::DropSegment { segment: old.id });
        }
    }

    pub fn register_callback(&self, cb: Callback) -> u64 {
        let token = self.alloc_id();
        self.register_callback_as(token, cb);
        token
    }

    /// Registers `cb` under a token of the worker this one replaces (a rebuilt context's
    /// `pfn_notify`, whose token the worker was given again).
    pub fn register_callback_as(&self, token: u64, cb: Callback) {
        if matches!(cb, Callback::Event { .. }) {
            // Counted before the worker can hear of it (see `event_callbacks`).
            self.event_callbacks.fetch_add(1, Ordering::SeqCst);
        }
        self.callbacks.lock().unwrap_or_else(|e| e.into_inner()).insert(token, cb);
    }

    /// Takes a callback out before it ran; the caller drops what it kept alive for it.
    pub fn unregister_callback(&self, token: u64) -> Option<Callback> {
        let cb = self.callbacks.lock().unwrap_or_else(|e| e.into_inner()).remove(&token);
        if matches!(cb, Some(Callback::Event { .. })) {
            self.event_callback_done();
        }
        cb
    }

    /// An event callback left `callbacks` and has run, or never will.
    fn event_callback_done(&self) {
        self.event_callbacks.fetch_sub(1, Ordering::SeqCst);
    }

    /// Unregisters a context's callback when the application releases the context: once this
    /// returns the callback is not running and never runs again. (Called from the callback
    /// itself, on the notifier thread, it does not wait for itself.)
    pub fn unregister_context_callback(&self, token: u64) {
        let _ = self.unregister_callback(token);
        if std::thread::current().name() == Some(NOTIFIER) {
            return;
        }
        let mut running = self.running_context.lock().unwrap_or_else(|e| e.into_inner());
        while *running == Some(token) {
            running = self.context_ran.wait(running).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Runs context callback `token` if it is still registered, marked as running so that a
    /// release waits for it (see `unregister_context_callback`).
    fn run_context_callback(&self, token: u64, call: impl FnOnce(ContextNotifyFn, usize)) {
        let cbs = self.callbacks.lock().unwrap_or_else(|e| e.into_inner());
        let Some(&Callback::Context { pfn, user_data }) = cbs.get(&token) else { return };
        // Marked before the map's lock goes: a release that removes the token after this
        // sees it running and waits.
        *self.running_context.lock().unwrap_or_else(|e| e.into_inner()) = Some(token);
        drop(cbs);
        call(pfn, user_data);
        *self.running_context.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.context_ran.notify_all();
    }

    /// Waits until the build callback `token` has run. The worker says when the driver called
    /// it before the build call returned (as pocl does): directly, the callback has then run by
    /// the time the application's call returns, so it must have here too.
    ///
    /// A worker that announced the callback and never sends it is given up on at the build
    /// deadline, like a build that never returns: the worker is cut off, and its death runs
    /// the callback (the application's build then reads as failed).
    pub fn await_build_callback(&self, token: u64) {
        let deadline_ms = self.deadlines.build_ms + SHIM_GRACE_MS;
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(deadline_ms);
        let mut cbs = self.callbacks.lock().unwrap_or_else(|e| e.into_inner());
        while cbs.contains_key(&token) && !self.is_dead() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                drop(cbs);
                crate::base::warn(&format!(
                    "the worker for {} announced a build callback and did not send it within {deadline_ms} ms; \
                     giving up on it",
                    self.driver
                ));
                self.hang_up();
                return;
            }
            let timeout = left.min(std::time::Duration::from_millis(100));
            cbs = self.build_callback_ran.wait_timeout(cbs, timeout).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// The notifier thread: runs application callbacks, and notices the worker's death by EOF.
    fn notification_loop(self: Arc<Self>) {
        loop {
            // Marked busy before the message leaves the socket (see `await_completed_callbacks`).
            self.await_message();
            *self.delivering.lock().unwrap_or_else(|e| e.into_inner()) = true;
            let received = channel::recv::<WorkerMessage>(&self.sock);
            // Only the end of the channel ends the loop: a thread that found the worker dead
            // first (a send on its closed socket) has marked it so, but the death is handled
            // here (a loop that stopped at that mark left it unhandled: no replacement, and a
            // replay-mode call waiting for one).
            let ended = match received {
                Ok((WorkerMessage::Notify(n), _)) => {
                    self.deliver(n);
                    false
                }
                Ok(_) => false,
                Err(_) => {
                    self.on_worker_death();
                    true
                }
            };
            *self.delivering.lock().unwrap_or_else(|e| e.into_inner()) = false;
            self.deliveries.fetch_add(1, Ordering::SeqCst);
            self.delivered.notify_all();
            if ended {
                // The watcher takes this thread's reference (see `DeathWatcher::died`).
                if let Some(w) = self.death_watcher.get().cloned() {
                    w.died(self);
                }
                return;
            }
        }
    }

    /// Returns once the worker's socket has a message (or was closed): polled without sleeping
    /// for as long as `notifier_spin` allows (nothing while no core is idle, nor on a machine of
    /// fewer than `NOTIFIER_SPIN_CORES`), then in `poll`.
    fn await_message(&self) {
        let start = std::time::Instant::now();
        let readable = |limit| channel::readable_within(&self.sock, limit);
        // A third spinner beside the application's thread and the worker's lane thread: with
        // fewer than four cores it takes one of theirs (2 pocl cores: 105-146 us a callback
        // spinning, 46-65 sleeping; the H200's 16: 38-41 against 44-51).
        let spun = cloister_ipc::lane::cores() >= NOTIFIER_SPIN_CORES
            && self.notifier_spin.spin(start, || readable(std::time::Duration::ZERO).then_some(())).is_some();
        if !spun {
            while !readable(std::time::Duration::from_secs(3600)) {}
        }
        self.notifier_spin.observe(start.elapsed());
    }

    /// After a wait on the worker: returns once the application's callbacks on events that are
    /// complete now have run, as they have directly when a wait returns (pocl runs them before
    /// its wait returns; the spec does not promise it, but applications and conformance tests
    /// rely on it). Only when event callbacks are waiting: each one's event status is asked
    /// (at most `MAX_AWAITED` of them), and the notifier is given until `CALLBACK_GRACE` to
    /// deliver those of complete events (the driver calls them, so they come). Never on the
    /// notifier itself (a wait inside a callback) or while holding the settling lock the
    /// notifier may need.
    pub fn await_completed_callbacks(&self) {
        if self.event_callbacks.load(Ordering::SeqCst) == 0 {
            return;
        }
        if std::thread::current().name() == Some(NOTIFIER) || holds_notifier_lock() {
            return;
        }
        let deadline = std::time::Instant::now() + CALLBACK_GRACE;
        // A callback the notifier took out of the map may not have run yet: it is done when the
        // notifier is idle.
        self.await_notifier(deadline, &[]);
        let waiting: Vec<(u64, usize)> = {
            let cbs = self.callbacks.lock().unwrap_or_else(|e| e.into_inner());
            cbs.iter()
                .filter_map(|(&t, cb)| match *cb {
                    Callback::Event { event, .. } => Some((t, event)),
                    _ => None,
                })
                .take(MAX_AWAITED)
                .collect()
        };
        // One call asks them all; the worker sends the callbacks of those it finds complete
        // or failed right away (`worker/src/notify.rs`), so they are on their way already.
        let (tokens, ids): (Vec<u64>, Vec<ObjectId>) =
            waiting.into_iter().filter_map(|(t, event)| Some((t, self.above.event_id(event)?))).unzip();
        if ids.is_empty() {
            return;
        }
        // A worker that cannot answer is not waited for (a dead one's callbacks run on its
        // death), nor an event it does not hold.
        let Ok(statuses) = self.event_statuses(ids, Vec::new()) else { return };
        let due: Vec<u64> = tokens
            .into_iter()
            .zip(statuses)
            .filter(|&(_, status)| status <= CL_COMPLETE && status != CL_INVALID_EVENT)
            .map(|(t, _)| t)
            .collect();
        if !due.is_empty() {
            self.await_notifier(deadline, &due);
        }
    }

    /// The execution status of each of `events`, asked in one call (`EventStatuses`; each of
    /// `release_settled` is released by the worker once settled), or why the call failed. A
    /// worker that answers with another count than it was asked for is cut off.
    pub fn event_statuses(&self, events: Vec<ObjectId>, release_settled: Vec<ObjectId>) -> Result<Vec<cl_int>, cl_int> {
        let n = events.len();
        match self.call(cloister_ipc::EventStatuses { events, release_settled }) {
            Ok(r) if r.status == CL_SUCCESS && r.statuses.len() == n => Ok(r.statuses),
            Ok(r) if r.status == CL_SUCCESS => {
                let what = format!("{} statuses for {n} events", r.statuses.len());
                Err(self.reject("EventStatuses", &what))
            }
            Ok(r) => Err(r.status),
            Err(e) => Err(e),
        }
    }

    /// Waits until none of the callbacks `due` is registered (a callback leaves the map before
    /// it runs) and the notifier is idle (it runs callbacks while busy), or the worker died, or
    /// `deadline`.
    ///
    /// It first spins as long as `callback_spin` allows, watching the notifier's count of
    /// messages handled and taking its locks again only when that moved; then it sleeps on
    /// `delivered`.
    fn await_notifier(&self, deadline: std::time::Instant, due: &[u64]) {
        let start = std::time::Instant::now();
        let mut spinning = true;
        loop {
            let seen = self.deliveries.load(Ordering::SeqCst);
            let pending = {
                let cbs = self.callbacks.lock().unwrap_or_else(|e| e.into_inner());
                due.iter().any(|t| cbs.contains_key(t))
            };
            let busy = self.delivering.lock().unwrap_or_else(|e| e.into_inner());
            if (!pending && !*busy) || self.is_dead() || std::time::Instant::now() >= deadline {
                self.callback_spin.observe(start.elapsed());
                return;
            }
            if spinning {
                // Until the notifier has handled another message (then look again), within the
                // budget counted from the start; past it, look once more and sleep.
                drop(busy);
                let delivered = || (self.deliveries.load(Ordering::SeqCst) != seen).then_some(());
                spinning = self.callback_spin.spin(start, delivered).is_some();
                continue;
            }
            let tick = std::time::Duration::from_millis(5);
            drop(self.delivered.wait_timeout(busy, tick).unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// The worker is gone (EOF on its channel): wake every waiting thread, and give every
    /// callback still waiting on the worker its answer, so nothing in the application hangs.
    fn on_worker_death(self: &Arc<Self>) {
        let watcher = self.death_watcher.get().cloned();
        if let Some(w) = &watcher {
            w.dying();
        }
        self.mark_dead();
        for lane in self.lanes.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade) {
            lane.nudge();
        }
        // Contexts hear the broker's account (cause and report) first: before the calls that
        // met the death return (so the application learns why before it can release them, and
        // a released context's callback never runs), and before the replacement is announced.
        // Contexts' callbacks stay registered until they run, so a release still stops them.
        let why = watcher
            .as_ref()
            .and_then(|w| w.account())
            .map(|a| format!(": {a}"))
            .unwrap_or_else(|| " (see `cloister crashes`)".into());
        let message = match self.replays() {
            true => format!(
                "cloister: the worker hosting driver {} died{why}. Recovery by replay: cloister rebuilds \
                 this context's objects in a new worker; calls wait for it, and another message says how it went.",
                self.driver
            ),
            false => format!(
                "cloister: the worker hosting driver {} died{why}. This context and its objects are lost: \
                 create a new context on the same device to continue.",
                self.driver
            ),
        };
        let msg = std::ffi::CString::new(message).unwrap_or_default();
        let mut tokens: Vec<u64> = {
            let cbs = self.callbacks.lock().unwrap_or_else(|e| e.into_inner());
            cbs.iter().filter(|(_, cb)| matches!(cb, Callback::Context { .. })).map(|(&t, _)| t).collect()
        };
        tokens.sort_unstable();
        for token in tokens {
            self.run_context_callback(token, |pfn, user_data| {
                // SAFETY: the application registered pfn with this signature and user_data, and
                // has not released the context (its token would be gone).
                unsafe { pfn(msg.as_ptr(), std::ptr::null(), 0, user_data as *mut c_void) };
            });
            let _ = self.unregister_callback(token);
        }
        // The calls that failed on this death return now (see `await_death_told`).
        *self.death_told.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.death_told_cv.notify_all();
        self.above.settle(self);
        let callbacks: Vec<Callback> = {
            let mut cbs = self.callbacks.lock().unwrap_or_else(|e| e.into_inner());
            cbs.drain().map(|(_, cb)| cb).collect()
        };
        for cb in callbacks {
            // SAFETY (all arms): the application registered each function with this signature
            // and its user_data; handles are the application's own.
            match cb {
                Callback::Context { .. } => {}
                Callback::Shim(run) => run(self, FAULT),
                Callback::Build { pfn, user_data, program } => {
                    unsafe { pfn(program as cl_program, user_data as *mut c_void) };
                    self.above.release(program, ObjectKind::Program);
                }
                Callback::Event { pfn, user_data, event } => {
                    // In replay mode it waits for the event's rebuilt command instead.
                    if !(self.replays() && self.above.keep_event_callback(self, pfn, user_data, event)) {
                        unsafe { pfn(event as cl_event, FAULT, user_data as *mut c_void) };
                        self.above.release(event, ObjectKind::Event);
                    }
                    self.event_callback_done();
                }
            }
        }
    }

    fn deliver(&self, n: Notification) {
        let mut cbs = self.callbacks.lock().unwrap_or_else(|e| e.into_inner());
        match n {
            Notification::ContextError { token, errinfo, private_info } => {
                drop(cbs);
                let msg = std::ffi::CString::new(errinfo.replace('\0', " ")).unwrap_or_default();
                self.run_context_callback(token, |pfn, user_data| {
                    // SAFETY: the application registered pfn with this signature and user_data,
                    // and has not released the context (its token would be gone).
                    unsafe {
                        pfn(msg.as_ptr(), private_info.as_ptr().cast(), private_info.len(), user_data as *mut c_void)
                    };
                });
            }
            Notification::SlabIdle { segment } => {
                drop(cbs);
                self.slabs.idle(segment);
            }
            Notification::BuildDone { token } => {
                let Some(&Callback::Build { pfn, user_data, program }) = cbs.get(&token) else {
                    return;
                };
                drop(cbs);
                // SAFETY: as above; program is the application's handle.
                unsafe { pfn(program as cl_program, user_data as *mut c_void) };
                // The token stays registered until the callback has returned: a build call
                // waiting in `await_build_callback` returns after it, not during it.
                self.callbacks.lock().unwrap_or_else(|e| e.into_inner()).remove(&token);
                self.build_callback_ran.notify_all();
                // The program was kept alive for its callback (see `Callback::Build`).
                self.above.release(program, ObjectKind::Program);
            }
            Notification::LateError { token, op, code } => {
                drop(cbs);
                let msg = std::ffi::CString::new(late_error_message(op, code)).unwrap_or_default();
                self.run_context_callback(token, |pfn, user_data| {
                    // SAFETY: as for ContextError.
                    unsafe { pfn(msg.as_ptr(), std::ptr::null(), 0, user_data as *mut c_void) };
                });
            }
            Notification::EventStatus { token, status } => {
                let (pfn, user_data, event) = match cbs.remove(&token) {
                    Some(Callback::Event { pfn, user_data, event }) => (pfn, user_data, event),
                    Some(Callback::Shim(run)) => {
                        drop(cbs);
                        if status <= CL_COMPLETE {
                            self.above.settle(self);
                        }
                        run(self, status);
                        return;
                    }
                    _ => return,
                };
                drop(cbs);
                if status <= CL_COMPLETE {
                    // A finished read's data must be in place before the callback can look.
                    self.above.settle(self);
                }
                // SAFETY: as above; event is the application's handle, kept alive by the retain
                // taken at registration and dropped right after.
                unsafe { pfn(event as cl_event, status, user_data as *mut c_void) };
                self.above.release(event, ObjectKind::Event);
                self.event_callback_done();
            }
        }
    }
}

/// What the context's callback hears when a posted enqueue failed in the driver. `op` and `code`
/// come from the worker: only names from the shim's own tables go into the text.
fn late_error_message(op: u32, code: cl_int) -> String {
    let call = match cloister_ipc::OP_NAMES.get(op as usize).copied() {
        Some("EnqueueNdRange") => "clEnqueueNDRangeKernel",
        Some("EnqueueCopyBuffer") => "clEnqueueCopyBuffer",
        Some("EnqueueFillBuffer") => "clEnqueueFillBuffer",
        Some("EnqueueMarkerOrBarrier") => "clEnqueueMarkerWithWaitList/clEnqueueBarrierWithWaitList",
        Some("EnqueueUnmapMemObject") => "clEnqueueUnmapMemObject",
        Some("EnqueueWriteBuffer") => "clEnqueueWriteBuffer",
        Some("EnqueueReadBuffer") => "clEnqueueReadBuffer",
        Some("EnqueueDone") => "the event of a transfer or map cloister made itself",
        Some("CreateBuffer") => "clCreateBuffer",
        _ => "an enqueue",
    };
    let name = cloister_ipc::cl::error_name(code).unwrap_or("an unknown error");
    if call == "clCreateBuffer" {
        return format!(
            "cloister: {call} failed in the driver with {name} ({code}) after the call had returned CL_SUCCESS \
             (cloister creates buffers asynchronously, as a driver may allocate a buffer's memory at its first \
             use). Every later use of the buffer returns this error; releasing it succeeds. \
             Set CLOISTER_SYNC=1 to have each creation return its own error."
        );
    }
    format!(
        "cloister: {call} failed in the driver with {name} ({code}) after the call had returned CL_SUCCESS \
         (cloister enqueues asynchronously). The command's event, if one was asked for, has this status, \
         and the next blocking call on its queue (clFinish, a blocking read, write or map) returns it. \
         Set CLOISTER_SYNC=1 to have each enqueue return its own error."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The transport alone: no layer above keeps anything (the workers here announce no
    /// platform, and the callbacks hold no handle).
    struct Bare;

    impl Above for Bare {
        fn adopt(
            &self,
            _: &Arc<Conn>,
            _: &[ObjectId],
            _: &[Enumerated],
            _: Option<&[(usize, Vec<usize>)]>,
        ) -> Vec<(usize, Vec<usize>)> {
            Vec::new()
        }
        fn settle(&self, _: &Conn) {}
        fn release(&self, _: usize, _: ObjectKind) {}
        fn event_id(&self, _: usize) -> Option<ObjectId> {
            None
        }
        fn keep_event_callback(&self, _: &Conn, _: EventNotifyFn, _: usize, _: usize) -> bool {
            false
        }
        fn released(&self, _: &Conn, _: ObjectId) {}
        fn await_restarts(&self) -> bool {
            false
        }
        fn dispatch(&self) -> &'static IcdDispatch {
            &crate::DISPATCH
        }
        fn timing(&self) -> bool {
            false
        }
        fn worker_time(&self, _: u64, _: Duration) {}
        fn unfinished(&self, _: &Conn, _: ObjectId) {}
    }

    /// Short deadlines for this test process (read once, before any connection).
    fn short_deadlines() {
        static SET: std::sync::Once = std::sync::Once::new();
        SET.call_once(|| {
            std::env::set_var("CLOISTER_DEADLINE_BUILD_MS", "300");
            std::env::set_var("CLOISTER_DEADLINE_OTHER_MS", "300");
            std::env::set_var("CLOISTER_QUIET", "1");
        });
    }

    /// Runs `f` on a thread; fails the test if it has not returned within `limit`.
    fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit).expect("the wait on the worker has no deadline")
    }

    #[test]
    fn a_worker_that_never_welcomes_is_given_up_on() {
        short_deadlines();
        let (ours, theirs) = channel::seqpacket_pair().unwrap();
        // The "worker" reads the hello and never answers, keeping its end open.
        let worker = std::thread::spawn(move || {
            let _ = channel::recv::<ShimMessage>(&theirs);
            std::thread::sleep(Duration::from_secs(8));
        });
        let started = Instant::now();
        let result = within(Duration::from_secs(6), move || Conn::connect(ours, "silent", None, &Bare).map(|_| ()));
        assert!(result.unwrap_err().contains("did not answer its welcome"));
        assert!(started.elapsed() >= Duration::from_millis(300));
        drop(worker);
    }

    /// A stand-in worker's first step: reads the shim's hello and welcomes it as driver `driver`,
    /// with no platforms.
    fn welcome(theirs: &OwnedFd, driver: &str) {
        let _ = channel::recv::<ShimMessage>(theirs);
        let welcome = WorkerMessage::Welcome {
            version: cloister_ipc::handshake::PROTOCOL_VERSION,
            driver: driver.into(),
            profile: "none".into(),
            layers: vec![],
            platforms: vec![],
            devices: vec![],
        };
        channel::send(theirs, &welcome, &[]).unwrap();
    }

    /// The count `await_completed_callbacks` skips its waits by: one per event callback until
    /// it has run (delivered by the worker's notification), been unregistered, or met the
    /// worker's death; never below zero (checked: without the count at registration, a wait
    /// would not wait for a callback whose event completed, and the count wraps).
    #[test]
    fn event_callbacks_are_counted_until_they_ran_or_went() {
        let (ours, theirs) = channel::seqpacket_pair().unwrap();
        let (go, told) = std::sync::mpsc::channel::<u64>();
        let worker = std::thread::spawn(move || {
            welcome(&theirs, "counted");
            // Completes the event of each token it is told of; hangs up when told 0.
            while let Ok(token) = told.recv() {
                if token == 0 {
                    return;
                }
                let n = WorkerMessage::Notify(Notification::EventStatus { token, status: CL_COMPLETE });
                channel::send(&theirs, &n, &[]).unwrap();
            }
        });
        let conn = Conn::connect(ours, "counted", None, &Bare).unwrap();
        static RAN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        unsafe extern "C" fn on_event(_: cl_event, _: cl_int, ran: *mut c_void) {
            // SAFETY: user_data is &RAN, a static.
            unsafe { &*(ran as *const std::sync::atomic::AtomicU32) }.fetch_add(1, Ordering::SeqCst);
        }
        let event = || Callback::Event { pfn: on_event, user_data: &RAN as *const _ as usize, event: 0 };
        let count = |conn: &Conn| conn.event_callbacks.load(Ordering::SeqCst);
        let settles = |conn: &Conn, want: usize| {
            let end = Instant::now() + Duration::from_secs(5);
            while count(conn) != want && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
            count(conn)
        };
        assert_eq!(count(&conn), 0);
        // A build callback is not counted.
        let build = conn.register_callback(Callback::Build { pfn: on_built_never, user_data: 0, program: 0 });
        assert_eq!(count(&conn), 0);
        assert!(conn.unregister_callback(build).is_some());
        // Registered, then unregistered before it ran.
        let gone = conn.register_callback(event());
        assert_eq!(count(&conn), 1);
        assert!(conn.unregister_callback(gone).is_some());
        assert!(conn.unregister_callback(gone).is_none());
        assert_eq!(count(&conn), 0);
        // Registered, then delivered: counted until it has run.
        let delivered = conn.register_callback(event());
        let kept = conn.register_callback(event());
        assert_eq!(count(&conn), 2);
        go.send(delivered).unwrap();
        assert_eq!(settles(&conn, 1), 1);
        assert_eq!(RAN.load(Ordering::SeqCst), 1);
        // A second notification for the same token finds nothing: not counted again.
        go.send(delivered).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(count(&conn), 1);
        // The worker's death runs the one left (with its fault status).
        go.send(0).unwrap();
        worker.join().unwrap();
        assert_eq!(settles(&conn, 0), 0);
        assert_eq!(RAN.load(Ordering::SeqCst), 2);
        assert!(conn.unregister_callback(kept).is_none());
        assert_eq!(count(&conn), 0);
    }

    unsafe extern "C" fn on_built_never(_: cl_program, _: *mut c_void) {}

    #[test]
    fn a_build_callback_announced_but_never_sent_is_given_up_on() {
        short_deadlines();
        let (ours, theirs) = channel::seqpacket_pair().unwrap();
        let worker = std::thread::spawn(move || {
            welcome(&theirs, "quiet");
            // Never sends the BuildDone it "announced"; stays connected until the shim hangs up.
            while channel::recv::<ShimMessage>(&theirs).is_ok() {}
        });
        let conn = Conn::connect(ours, "quiet", None, &Bare).unwrap();
        static RAN: AtomicBool = AtomicBool::new(false);
        unsafe extern "C" fn on_built(_: cl_program, ran: *mut c_void) {
            // SAFETY: user_data is &RAN, a static.
            unsafe { &*(ran as *const AtomicBool) }.store(true, Ordering::SeqCst);
        }
        let token =
            conn.register_callback(Callback::Build { pfn: on_built, user_data: &RAN as *const _ as usize, program: 0 });
        let waiting = conn.clone();
        within(Duration::from_secs(6), move || waiting.await_build_callback(token));
        // Given up on: the worker is cut off, and its death runs the application's callback.
        worker.join().unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while !RAN.load(Ordering::SeqCst) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(RAN.load(Ordering::SeqCst), "the callback never ran");
        assert!(conn.is_dead());
    }
}
