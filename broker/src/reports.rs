//! Reports on demand (`cloister timing`): shims whose timing report is on keep a second
//! connection here (`ServeReports`); a client's `AskReports` is answered by asking each of them
//! (`Query`) in turn. What a shim sends is its application's text, passed on as it is (the CLI
//! escapes it for the terminal); the broker only bounds it: one frame each, within a deadline,
//! on the asking client's own thread, so a slow or silent shim delays only that client, and
//! one that misses its deadline is forgotten (a late answer must not be taken for the next one).

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloister_ipc::{channel, AppReport, BrokerReply, BrokerRequest};

/// How long a shim has to answer.
const DEADLINE: Duration = Duration::from_secs(3);

/// A shim that serves reports: its application as the kernel named it when it connected.
struct Server {
    pid: u32,
    app: String,
    sock: Mutex<OwnedFd>,
}

fn servers() -> &'static Mutex<Vec<Arc<Server>>> {
    static S: Mutex<Vec<Arc<Server>>> = Mutex::new(Vec::new());
    &S
}

/// Whether a connection that should be silent has something to read: the shim closed it (or
/// spoke out of turn). Either way it is of no more use.
fn gone(sock: &OwnedFd) -> bool {
    channel::readable_within(sock, Duration::ZERO)
}

/// Keeps `sock` (a shim's `ServeReports` connection) for `AskReports`.
pub fn register(pid: u32, app: String, sock: OwnedFd) {
    let mut s = servers().lock().unwrap_or_else(|e| e.into_inner());
    // Those whose application has gone since: found here, so none piles up.
    s.retain(|srv| srv.sock.try_lock().map(|sock| !gone(&sock)).unwrap_or(true));
    s.push(Arc::new(Server { pid, app, sock: Mutex::new(sock) }));
}

fn forget(server: &Arc<Server>) {
    servers().lock().unwrap_or_else(|e| e.into_inner()).retain(|s| !Arc::ptr_eq(s, server));
}

/// The reports of application `pid` (or of every one), each asked for in turn.
pub fn ask(pid: Option<u32>) -> Vec<AppReport> {
    let chosen: Vec<Arc<Server>> = servers()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|s| pid.is_none_or(|p| p == s.pid))
        .cloned()
        .collect();
    let mut out = Vec::new();
    for server in chosen {
        let answer = {
            // One question at a time per shim: answers come back in order.
            let sock = server.sock.lock().unwrap_or_else(|e| e.into_inner());
            if gone(&sock) {
                None
            } else {
                Some(query(&sock))
            }
        };
        match answer {
            // The application has ended: no report, and no entry.
            None => forget(&server),
            Some(timing) => {
                if timing.is_err() {
                    forget(&server);
                }
                out.push(AppReport { pid: server.pid, app: server.app.clone(), timing });
            }
        }
    }
    out
}

/// Asks one shim, within the deadline.
fn query(sock: &OwnedFd) -> Result<String, String> {
    channel::send(sock, &BrokerReply::Query, &[]).map_err(|e| format!("cannot ask: {e}"))?;
    if !channel::readable_within(sock, DEADLINE) {
        return Err(format!("no answer within {} s", DEADLINE.as_secs()));
    }
    match channel::recv::<BrokerRequest>(sock) {
        Ok((BrokerRequest::Report { timing: Some(t) }, _)) => Ok(t),
        Ok((BrokerRequest::Report { timing: None }, _)) => Err("its timing report is off".into()),
        Ok(_) => Err("it answered out of turn".into()),
        Err(e) => Err(format!("its answer: {e}")),
    }
}

/// The broker application `pid` talks to: its `CLOISTER_SOCKET` (as `cloister run` sets it),
/// else ours, else the per-user broker's.
fn broker_of(pid: Option<u32>) -> std::path::PathBuf {
    let theirs = pid
        .and_then(|p| std::fs::read(format!("/proc/{p}/environ")).ok())
        .and_then(|env| env.split(|b| *b == 0).find_map(|v| v.strip_prefix(b"CLOISTER_SOCKET=").map(|s| s.to_vec())));
    if let Some(path) = theirs.filter(|p| !p.is_empty()) {
        use std::os::unix::ffi::OsStringExt;
        return std::ffi::OsString::from_vec(path).into();
    }
    match cloister_ipc::settings::get("socket", None) {
        Some(path) => path.into(),
        None => cloister_ipc::private::user_socket().1,
    }
}

/// `cloister timing [PID]`: prints the timing report of a running application (of every one
/// that serves them at its broker, without PID). `socket` names the broker instead.
pub fn cli(pid: Option<u32>, socket: Option<std::path::PathBuf>) -> Result<std::process::ExitCode, String> {
    let path = socket.unwrap_or_else(|| broker_of(pid));
    let sock =
        channel::connect_seqpacket(&path).map_err(|e| format!("cannot reach the broker at {}: {e}", path.display()))?;
    cloister_ipc::private::check_peer_is_us(std::os::fd::AsRawFd::as_raw_fd(&sock), &path)?;
    let hello = cloister_ipc::handshake::Hello::new();
    channel::send(&sock, &BrokerRequest::AskReports { hello, pid }, &[]).map_err(|e| e.to_string())?;
    // Each application has its deadline in the broker; this one covers a few of them.
    if !channel::readable_within(&sock, DEADLINE * 4) {
        return Err("the broker did not answer".into());
    }
    let reports = match channel::recv::<BrokerReply>(&sock).map_err(|e| format!("broker: {e}"))?.0 {
        BrokerReply::Reports { reports } => reports,
        BrokerReply::Refused { reason } => return Err(format!("broker refused: {reason}")),
        _ => return Err("the broker answered out of turn".into()),
    };
    if reports.is_empty() {
        let whom = pid.map_or("no application serves".to_string(), |p| format!("application {p} serves no"));
        return Err(format!("{whom} timing report at the broker {} (is it running with --timing?)", path.display()));
    }
    let mut failed = false;
    for r in reports {
        let app = cloister_crash_reports::escape(&r.app, false);
        match r.timing {
            Ok(text) => print!("== {app} (pid {}) ==\n{}", r.pid, cloister_crash_reports::escape(&text, true)),
            Err(why) => {
                failed = true;
                eprintln!("cloister: {app} (pid {}): {}", r.pid, cloister_crash_reports::escape(&why, false));
            }
        }
    }
    Ok(if failed { std::process::ExitCode::FAILURE } else { std::process::ExitCode::SUCCESS })
}
