//! Process-wide state: the connection to the broker and the workers it granted.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use cloister_ipc::handshake::Hello;
use cloister_ipc::{channel, BrokerReply, BrokerRequest};

use crate::conn::Conn;

pub struct Runtime {
    pub conns: Vec<Arc<Conn>>,
}

impl Runtime {
    /// Every platform handle, across workers, in order.
    pub fn platforms(&self) -> Vec<usize> {
        self.conns.iter().flat_map(|c| c.platforms.get().into_iter().flatten().map(|(p, _)| *p)).collect()
    }
}

pub fn warn(msg: &str) {
    if std::env::var_os("CLOISTER_QUIET").is_none() {
        eprintln!("cloister: {msg}");
    }
}

pub fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| match connect() {
        Ok(rt) => rt,
        Err(e) => {
            warn(&e);
            Runtime { conns: Vec::new() }
        }
    })
}

fn connect() -> Result<Runtime, String> {
    let path = std::env::var("CLOISTER_SOCKET")
        .map_err(|_| "CLOISTER_SOCKET is not set: start the application with `cloister run -- APP`".to_string())?;
    let sock = connect_seqpacket(&path).map_err(|e| format!("cannot reach the broker at {path}: {e}"))?;
    channel::send(&sock, &BrokerRequest::Hello(Hello::new()), &[]).map_err(|e| e.to_string())?;
    let (reply, fds) = channel::recv::<BrokerReply>(&sock).map_err(|e| format!("broker: {e}"))?;
    let (grants, errors) = match reply {
        BrokerReply::Workers { version, grants, errors } => {
            if version != cloister_ipc::handshake::PROTOCOL_VERSION {
                return Err(format!(
                    "broker speaks protocol v{version}; shim and broker must come from the same build"
                ));
            }
            (grants, errors)
        }
        BrokerReply::Refused { reason } => return Err(format!("broker refused: {reason}")),
    };
    for e in errors {
        warn(&e);
    }
    let mut conns = Vec::new();
    for (grant, fd) in grants.iter().zip(fds) {
        match Conn::connect(fd, &grant.driver) {
            Ok(c) => conns.push(c),
            Err(e) => warn(&e),
        }
    }
    Ok(Runtime { conns })
}

fn connect_seqpacket(path: &str) -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the fd is owned immediately.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: zeroed sockaddr_un is valid; the path is copied in bounds below.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "socket path too long"));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: addr is a valid sockaddr_un of the given size.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}
