//! The ICD dispatch table, derived from `api_table.rs`. The shim fills one with its own entry
//! points; the worker reads the driver's from the first word of each driver handle.
#![allow(non_snake_case)]

use crate::cl::*;
use std::ffi::c_void;

macro_rules! slot_type {
    (windows, ($($arg:ident : $ty:ty),*) -> $ret:ty) => { *const c_void };
    ($status:ident, ($($arg:ident : $ty:ty),*) -> $ret:ty) => { Option<unsafe extern "C" fn($($ty),*) -> $ret> };
}

macro_rules! define_dispatch {
    ($( ($slot:literal, $name:ident, $status:ident, ($($arg:ident : $ty:ty),*) -> $ret:ty, $err:ident); )*) => {
        /// `struct _cl_icd_dispatch`, slot for slot.
        #[repr(C)]
        pub struct IcdDispatch {
            $( pub $name: slot_type!($status, ($($arg : $ty),*) -> $ret), )*
        }

        /// Entry point names in slot order, with cloister's status for each.
        pub const ENTRY_POINTS: &[(&str, &str)] = &[ $( (stringify!($name), stringify!($status)) ),* ];
    };
}

crate::for_each_cl_entry_point!(define_dispatch);

const _: () = assert!(std::mem::size_of::<IcdDispatch>() == crate::api_table::DISPATCH_SLOTS * 8);

// SAFETY: the table holds only function pointers and, for Windows-only slots, pointers that are
// always null; it is never mutated after construction.
unsafe impl Sync for IcdDispatch {}
// SAFETY: as above.
unsafe impl Send for IcdDispatch {}
