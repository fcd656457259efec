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
