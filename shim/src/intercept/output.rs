//! Where observations go: stderr or a file, whole records at a time under one lock, so lines
//! from different threads never interleave (the Intercept Layer's do).

use std::io::Write;
use std::sync::Mutex;

/// A destination: stderr (unbuffered, each record one write under the lock) or a buffered file.
pub struct Sink {
    out: Mutex<Out>,
    /// For the call log: only failing calls (`CLOISTER_LOG_ERRORS`).
    pub errors_only: bool,
}

enum Out {
    Stderr,
    File(std::io::BufWriter<std::fs::File>),
    /// Its last record is written (`close`): what other threads still send is dropped, so a
    /// report or a trace stays whole.
    Closed,
}

impl Sink {
    /// Setting `key`'s destination (see `cloister_ipc::config::Kind::Output`): unset (or `0`)
    /// is off; `-`, `1` or `stderr` is stderr; anything else a file, created (or truncated). A
    /// file that cannot be created is said once, then stderr.
    pub fn from_setting(key: &str) -> Option<Sink> {
        let v = cloister_ipc::settings::get(key, None)?;
        let out = match v.trim() {
            "" | "0" => return None,
            "1" | "-" | "stderr" => Out::Stderr,
            path => match std::fs::File::create(path) {
                Ok(f) => Out::File(std::io::BufWriter::with_capacity(1 << 16, f)),
                Err(e) => {
                    eprintln!("cloister: {key}: cannot create {path}: {e}; writing to stderr");
                    Out::Stderr
                }
            },
        };
        Some(Sink { out: Mutex::new(out), errors_only: false })
    }

    pub fn errors_only(mut self, yes: bool) -> Sink {
        self.errors_only = yes;
        self
    }

    /// Writes one whole record.
    pub fn write(&self, record: &[u8]) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = match &mut *out {
            Out::Stderr => std::io::stderr().lock().write_all(record),
            Out::File(f) => f.write_all(record),
            Out::Closed => Ok(()),
        };
    }

    /// Writes the last record, flushed; nothing more is written after it.
    pub fn close(&self, last: &[u8]) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = match &mut *out {
            Out::Stderr => std::io::stderr().lock().write_all(last),
            Out::File(f) => f.write_all(last).and_then(|()| f.flush()),
            Out::Closed => Ok(()),
        };
        *out = Out::Closed;
    }

    pub fn flush(&self) {
        if let Out::File(f) = &mut *self.out.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = f.flush();
        }
    }
}
