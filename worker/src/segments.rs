//! Shared segments the shim sent for bulk data (mappings, transfers too big for a lane).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cloister_ipc::fast_hash::FastMap;
use cloister_ipc::shm::{SharedMapping, SharedRegion};

/// A segment arrives on the socket, the request that uses it on a lane; the lane thread may
/// get there first, so lookups wait briefly for a missing segment. Its fd is closed as it
/// arrives (the mapping is all the worker needs): a worker must not hold a descriptor per
/// segment, nor per slab its buffers keep mapped.
#[derive(Default)]
pub struct Segments {
    map: Mutex<FastMap<u64, Arc<SharedMapping>>>,
    arrived: Condvar,
}

impl Segments {
    pub fn insert(&self, id: u64, region: SharedRegion) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Arc::new(region.into_mapping()));
        self.arrived.notify_all();
    }

    pub fn get(&self, id: u64) -> Option<Arc<SharedMapping>> {
        self.wait_for(|map| map.get(&id).cloned())
    }

    /// Takes a segment out for good (a zero-copy buffer's memory), waiting for it like `get`.
    pub fn take(&self, id: u64) -> Option<Arc<SharedMapping>> {
        self.wait_for(|map| map.remove(&id))
    }

    fn wait_for(
        &self,
        mut found: impl FnMut(&mut FastMap<u64, Arc<SharedMapping>>) -> Option<Arc<SharedMapping>>,
    ) -> Option<Arc<SharedMapping>> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // Almost always there already: the clock is read only for a wait.
        if let Some(r) = found(&mut map) {
            return Some(r);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(r) = found(&mut map) {
                return Some(r);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            map = self.arrived.wait_timeout(map, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    pub fn remove(&self, id: u64) -> Option<Arc<SharedMapping>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(&id)
    }
}

/// Which slabs hold buffers the driver has not destroyed yet, and which the shim retired
/// (`RetireSlab`): when a retired slab's last buffer is destroyed, the shim hears
/// `Notification::SlabIdle` and may carve the slab again. The driver's destructor callbacks
/// run on its own threads, hence one table for the process.
pub mod slab_use {
    use std::sync::Mutex;

    use cloister_ipc::fast_hash::FastMap;
    use cloister_ipc::Notification;

    #[derive(Default, Debug, PartialEq, Eq)]
    struct Use {
        /// Buffers in the slab the driver holds.
        live: usize,
        retired: bool,
    }

    static SLABS: Mutex<Option<FastMap<u64, Use>>> = Mutex::new(None);

    fn with<T>(f: impl FnOnce(&mut FastMap<u64, Use>) -> T) -> T {
        f(SLABS.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(FastMap::default))
    }

    /// A buffer was made in `segment`: the slab is in use again (after a retirement, the shim
    /// carves it again only once it heard it idle).
    pub fn hold(segment: u64) {
        with(|slabs| {
            let u = slabs.entry(segment).or_default();
            u.live += 1;
            u.retired = false;
        });
    }

    /// The driver destroyed a buffer in `segment`. Returns whether the slab was said idle.
    pub fn let_go(segment: u64) -> bool {
        let idle = with(|slabs| {
            slabs.get_mut(&segment).is_some_and(|u| {
                let was = u.live;
                u.live = was.saturating_sub(1);
                was == 1 && u.retired
            })
        });
        say_idle(segment, idle)
    }

    /// The shim carves nothing more out of `segment` until it hears it idle. Returns whether
    /// it was said idle at once.
    pub fn retire(segment: u64) -> bool {
        let idle = with(|slabs| {
            let u = slabs.entry(segment).or_default();
            u.retired = true;
            u.live == 0
        });
        say_idle(segment, idle)
    }

    fn say_idle(segment: u64, idle: bool) -> bool {
        if idle {
            crate::notify::send(Notification::SlabIdle { segment });
        }
        idle
    }

    /// `segment` left the worker's table (`DropSegment`): nothing more is said of it.
    pub fn forget(segment: u64) {
        with(|slabs| slabs.remove(&segment));
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_retired_slab_is_said_idle_once_its_last_buffer_is_destroyed_and_only_then() {
            // Segment ids of their own: the table is the process's.
            let (a, b) = (u64::MAX - 1, u64::MAX - 2);
            hold(a);
            hold(a);
            assert!(!let_go(a), "not retired: nothing said");
            assert!(!retire(a), "a buffer is still in it");
            assert!(let_go(a), "its last buffer");
            assert!(!let_go(a), "said once");
            // Carved again: in use, no longer retired.
            hold(a);
            assert!(!let_go(a));
            assert!(retire(a), "empty as it is retired: said at once");
            // A slab in which no buffer was ever made, and one the shim dropped.
            assert!(retire(b));
            hold(b);
            forget(b);
            assert!(!let_go(b), "forgotten: nothing said");
        }
    }
}
