//! The call log: one line per call, written whole after the call returns:
//! `[   0.012345 tid 4242] clCreateBuffer(context=ctx#1, flags=CL_MEM_READ_WRITE, size=4096, host_ptr=NULL) = mem#1 CL_SUCCESS 12.3us`

use std::fmt::Write;
use std::time::{Duration, Instant};

use super::names::{self, Arg};
use super::output::Sink;

#[allow(clippy::too_many_arguments)]
pub fn write(
    sink: &Sink,
    start: Instant,
    elapsed: Duration,
    name: &str,
    ret_ty: &'static str,
    result: u64,
    status: Option<i32>,
    args: &[Arg],
) {
    let ok = status.is_none_or(|s| s >= 0);
    let mut line = String::with_capacity(160);
    let _ = write!(line, "[{:12.6} tid {}] {name}(", super::micros(start) / 1e6, super::thread_id());
    names::format_args(&mut line, name, args, ok);
    line.push_str(") =");
    match names::kind_of(ret_ty) {
        Some(kind) => {
            line.push(' ');
            line.push_str(&names::name_of(kind, result));
        }
        None if names::spelled(ret_ty) == "*mut c_void" => {
            let _ = write!(line, " {result:#x}");
        }
        None => {}
    }
    if let Some(s) = status {
        line.push(' ');
        line.push_str(&names::status_name(s));
    }
    let _ = writeln!(line, " {:.1}us", elapsed.as_secs_f64() * 1e6);
    sink.write(line.as_bytes());
}
