//! Objects the application created and did not release by exit, per kind, with their names.

use std::collections::BTreeMap;
use std::fmt::Write;

pub fn report() {
    let mut per_kind: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (h, kind) in crate::handle::live_handles() {
        let name = super::names::known_name(h as u64).unwrap_or_else(|| format!("{h:#x}"));
        per_kind.entry(format!("{kind:?}")).or_default().push(name);
    }
    let mut out = String::new();
    if per_kind.is_empty() {
        out.push_str("cloister leaks: none (every object created was released)\n");
    } else {
        let total: usize = per_kind.values().map(Vec::len).sum();
        let _ = writeln!(out, "cloister leaks: {total} objects not released at exit");
        for (kind, mut names) in per_kind {
            names.sort_by_key(|n| n.split_once('#').and_then(|(_, i)| i.parse::<u64>().ok()).unwrap_or(u64::MAX));
            let _ = writeln!(out, "  {kind}: {} ({})", names.len(), names.join(", "));
        }
    }
    use std::io::Write as _;
    let _ = std::io::stderr().lock().write_all(out.as_bytes());
}
