//! The id <-> driver handle tables: the only state the worker keeps about the application.

use std::sync::RwLock;

use cloister_ipc::fast_hash::FastMap;
use cloister_ipc::ObjectId;

pub use cloister_ipc::ObjectKind as Kind;

#[derive(Default)]
struct Tables {
    by_id: FastMap<ObjectId, (Kind, usize)>,
    by_handle: FastMap<usize, ObjectId>,
}

#[derive(Default)]
pub struct ObjectTable {
    inner: RwLock<Tables>,
}

impl ObjectTable {
    pub fn insert(&self, id: ObjectId, kind: Kind, handle: usize) {
        let mut t = self.inner.write().unwrap_or_else(|e| e.into_inner());
        t.by_id.insert(id, (kind, handle));
        t.by_handle.insert(handle, id);
    }

    /// The driver handle for `id` if it exists and is of `kind`.
    pub fn get(&self, id: ObjectId, kind: Kind) -> Option<usize> {
        let t = self.inner.read().unwrap_or_else(|e| e.into_inner());
        match t.by_id.get(&id) {
            Some(&(k, h)) if k == kind => Some(h),
            _ => None,
        }
    }

    pub fn get_any(&self, id: ObjectId) -> Option<(Kind, usize)> {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).by_id.get(&id).copied()
    }

    /// The id the shim knows a driver handle by; 0 (NULL) for handles it never saw.
    pub fn id_of(&self, handle: usize) -> ObjectId {
        if handle == 0 {
            return 0;
        }
        self.inner.read().unwrap_or_else(|e| e.into_inner()).by_handle.get(&handle).copied().unwrap_or(0)
    }

    pub fn remove(&self, id: ObjectId) -> Option<(Kind, usize)> {
        let mut t = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let (kind, handle) = t.by_id.remove(&id)?;
        if t.by_handle.get(&handle) == Some(&id) {
            t.by_handle.remove(&handle);
        }
        Some((kind, handle))
    }
}
