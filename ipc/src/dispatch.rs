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

macro_rules! define_extension_fns {
    ($( ($ext:ident, $name:ident, ($($arg:ident : $ty:ty),*) -> $ret:ty, $err:ident); )*) => {
        /// A driver's extension entry points (those of `extension_table.rs`), found by name.
        pub struct ExtensionFns {
            $( pub $name: Option<unsafe extern "C" fn($($ty),*) -> $ret>, )*
        }

        impl ExtensionFns {
            /// `lookup` gets each NUL-terminated name and returns the driver's address or NULL.
            ///
            /// # Safety
            /// A non-NULL address `lookup` returns for a name must be that entry point, with the
            /// signature the extension table gives it.
            pub unsafe fn resolve(mut lookup: impl FnMut(&'static str) -> *mut c_void) -> Self {
                Self {
                    $( $name: {
                        let p = lookup(concat!(stringify!($name), "\0"));
                        // SAFETY: guaranteed by the caller.
                        (!p.is_null()).then(|| unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> $ret>(p)
                        })
                    }, )*
                }
            }
        }

        /// The forwarded extension entry points, with their extension.
        pub const EXTENSION_ENTRY_POINTS: &[(&str, &str)] = &[ $( (stringify!($ext), stringify!($name)) ),* ];
    };
}

crate::for_each_extension_entry_point!(define_extension_fns);

const _: () = assert!(std::mem::size_of::<IcdDispatch>() == crate::api_table::DISPATCH_SLOTS * 8);

// SAFETY: the table holds only function pointers and, for Windows-only slots, pointers that are
// always null; it is never mutated after construction.
unsafe impl Sync for IcdDispatch {}
// SAFETY: as above.
unsafe impl Send for IcdDispatch {}

/// What a coverage status means to a user.
pub fn status_meaning(status: &str) -> &'static str {
    match status {
        "forwarded" => "forwarded to the caged driver",
        "unimplemented" => "returns CL_INVALID_OPERATION",
        "windows" => "Windows-only; not exported",
        _ => "unknown",
    }
}

/// The README's coverage table, derived from the entry-point table.
pub fn coverage_markdown() -> String {
    let mut out = String::from("| slot | entry point | status |\n| ---: | --- | --- |\n");
    for (slot, (name, status)) in ENTRY_POINTS.iter().enumerate() {
        out.push_str(&format!("| {slot} | `{name}` | {} |\n", status_meaning(status)));
    }
    let forwarded = ENTRY_POINTS.iter().filter(|(_, s)| *s == "forwarded").count();
    out.push_str(&format!("\n{forwarded} of {} entry points forwarded.\n", ENTRY_POINTS.len()));
    out.push_str("\nExtension entry points without a dispatch slot, reached through ");
    out.push_str(
        "`clGetExtensionFunctionAddress[ForPlatform]`:\n\n| extension | entry point | status |\n| --- | --- | --- |\n",
    );
    for (ext, name) in EXTENSION_ENTRY_POINTS {
        out.push_str(&format!("| `{ext}` | `{name}` | {} |\n", status_meaning("forwarded")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's table must be the one derived from the code, so it can never drift.
    #[test]
    fn readme_coverage_table_matches_the_entry_point_table() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md");
        let table = coverage_markdown();
        assert!(
            readme.contains(&table),
            "README.md's coverage table is stale; regenerate it with `cloister coverage`:\n{table}"
        );
    }

    #[test]
    fn every_slot_has_a_known_status() {
        for (name, status) in ENTRY_POINTS {
            assert_ne!(status_meaning(status), "unknown", "{name}");
        }
    }
}
