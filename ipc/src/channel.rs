//! The bootstrap channel: a `SOCK_SEQPACKET` Unix socket carrying postcard frames and fds.
//! It stays open for the life of the connection so that EOF tells either side the other died.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use serde::{de::DeserializeOwned, Serialize};

use crate::IpcError;

/// Largest control frame; bulk data never travels on the socket.
pub const MAX_FRAME: usize = 1 << 20;
const MAX_FDS: usize = 8;

/// Creates a connected `SOCK_SEQPACKET` pair with close-on-exec set.
pub fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), IpcError> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid two-element array.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(IpcError::os("socketpair"));
    }
    // SAFETY: both fds are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Whether `sock` has something to read (or was closed) within `limit`.
pub fn readable_within(sock: &impl AsRawFd, limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd, as counted.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            return true;
        }
        if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// Sends one frame with optional fds attached.
pub fn send_raw(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> Result<(), IpcError> {
    send_raw_with(sock, bytes, fds, 0)
}

/// `send_raw` without fds that never waits for room: `Ok(false)` where the socket is full (the
/// frame was not sent).
pub fn try_send_raw(sock: RawFd, bytes: &[u8]) -> Result<bool, IpcError> {
    match send_raw_with(sock, bytes, &[], libc::MSG_DONTWAIT) {
        Ok(()) => Ok(true),
        Err(IpcError::Os(_, e)) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}

fn send_raw_with(sock: RawFd, bytes: &[u8], fds: &[RawFd], flags: libc::c_int) -> Result<(), IpcError> {
    if bytes.len() > MAX_FRAME || fds.len() > MAX_FDS {
        return Err(IpcError::Protocol("frame too large"));
    }
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() };
    let mut cmsg_buf = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; the fields are filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let fd_bytes = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
        msg.msg_control = cmsg_buf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at a buffer of at least `space` bytes (64 >= space for 8 fds),
        // so the first header and its data fit.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        }
    }
    loop {
        // SAFETY: msg is fully initialised and its buffers outlive the call.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL | flags) };
        if n >= 0 {
            return Ok(());
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(IpcError::os("sendmsg"));
        }
    }
}

/// One received frame: its bytes and the fds that rode along.
pub type Frame = (Vec<u8>, Vec<OwnedFd>);

thread_local! {
    /// Where this thread's frames land before they are copied out at their own length: room for
    /// the largest frame, allocated once and never cleared (the kernel writes what is read).
    /// A fresh zeroed `MAX_FRAME` buffer per frame cost a 1 MiB `memset` (glibc's calloc from
    /// the heap, once its mmap threshold has risen): about a million instructions and the L2's
    /// contents for each notification the shim's notifier took.
    static LANDING: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Receives one frame. `Ok(None)` is an orderly EOF: the peer is gone.
pub fn recv_raw(sock: RawFd) -> Result<Option<Frame>, IpcError> {
    // A nested receive on this thread (none today) would get a landing of its own.
    let landed = LANDING.try_with(|l| l.try_borrow_mut().ok().map(|mut buf| recv_into(sock, &mut buf)));
    match landed {
        Ok(Some(received)) => received,
        _ => recv_into(sock, &mut Vec::new()),
    }
}

/// `recv_raw` with `landing` as the room the frame lands in.
fn recv_into(sock: RawFd, landing: &mut Vec<u8>) -> Result<Option<Frame>, IpcError> {
    landing.clear();
    landing.reserve_exact(MAX_FRAME);
    let room = landing.spare_capacity_mut();
    let mut iov = libc::iovec { iov_base: room.as_mut_ptr().cast(), iov_len: room.len().min(MAX_FRAME) };
    let mut cmsg_buf = [0u64; 8];
    // SAFETY: zeroed msghdr is valid; fields set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg_buf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg_buf);
    let n = loop {
        // SAFETY: msg describes buffers we own for the duration of the call.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if err.raw_os_error() == Some(libc::ECONNRESET) {
            return Ok(None);
        }
        return Err(IpcError::os("recvmsg"));
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control; CMSG_* walk it within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(IpcError::Protocol("frame truncated"));
    }
    // SAFETY: the kernel wrote the frame's `n` bytes (at most the room's length) at its start.
    unsafe { landing.set_len(n) };
    Ok(Some((landing.as_slice().to_vec(), fds)))
}

/// Encodes and sends a message.
pub fn send<T: Serialize>(sock: &impl AsRawFd, msg: &T, fds: &[RawFd]) -> Result<(), IpcError> {
    send_raw(sock.as_raw_fd(), &encode(msg)?, fds)
}

/// A message's frame, as `send` writes it (for a sender that writes it later: `send_raw`).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, IpcError> {
    postcard::to_allocvec(msg).map_err(IpcError::Encode)
}

/// Receives and decodes a message; EOF is `IpcError::PeerGone`.
pub fn recv<T: DeserializeOwned>(sock: &impl AsRawFd) -> Result<(T, Vec<OwnedFd>), IpcError> {
    let (bytes, fds) = recv_raw(sock.as_raw_fd())?.ok_or(IpcError::PeerGone)?;
    let msg = postcard::from_bytes(&bytes).map_err(IpcError::Decode)?;
    Ok((msg, fds))
}

/// A `sockaddr_un` for `path`, or an error if the path does not fit.
fn unix_addr(path: &std::path::Path) -> std::io::Result<libc::sockaddr_un> {
    // SAFETY: an all-zero sockaddr_un is valid; the path is copied in bounds below.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_encoded_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "socket path too long"));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(addr)
}

fn seqpacket_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the fd is owned at once.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

const ADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;

/// Connects a `SOCK_SEQPACKET` socket to `path` (a broker).
pub fn connect_seqpacket(path: &std::path::Path) -> std::io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    let addr = unix_addr(path)?;
    // SAFETY: addr is a valid sockaddr_un of ADDR_LEN bytes.
    if unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), ADDR_LEN) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// A listening `SOCK_SEQPACKET` socket on `path`.
///
/// `bind` makes the path before `listen` lets anyone connect, and a client that saw the path in
/// between was refused (`ECONNREFUSED`): the socket is bound under a private name beside `path`,
/// made to listen, and only then linked to `path`, which appears ready or not at all. As with
/// `bind`, an existing `path` is an error (`AddrInUse`), never replaced. Where that cannot be
/// done (a path too long for the staging name beside it, a file system without hard links), the
/// socket is bound in place.
pub fn listen_seqpacket(path: &std::path::Path) -> std::io::Result<OwnedFd> {
    static STAGED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nth = STAGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let staging = path.with_file_name(format!(".{}.{nth}.listening", std::process::id()));
    if unix_addr(&staging).is_err() {
        return bind_and_listen(path);
    }
    let _ = std::fs::remove_file(&staging);
    let fd = bind_and_listen(&staging)?;
    let linked = std::fs::hard_link(&staging, path);
    let _ = std::fs::remove_file(&staging);
    match linked {
        Ok(()) => Ok(fd),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(std::io::ErrorKind::AddrInUse.into()),
        Err(_) => bind_and_listen(path),
    }
}

/// A `SOCK_SEQPACKET` socket bound to `path` and listening.
fn bind_and_listen(path: &std::path::Path) -> std::io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    let addr = unix_addr(path)?;
    // SAFETY: addr is a valid sockaddr_un of ADDR_LEN bytes; fd is a socket.
    if unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), ADDR_LEN) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a bound socket.
    if unsafe { libc::listen(fd.as_raw_fd(), 64) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_arrive_whole_at_their_own_length_one_after_another() {
        let (a, b) = seqpacket_pair().unwrap();
        // As large as a default socket buffer takes (about 200 KiB), then smaller ones on the
        // same thread: none carries the bytes of one before.
        let big: Vec<u8> = (0..150_000).map(|i| (i * 7 + 3) as u8).collect();
        for frame in [&big[..], b"short", &[9u8; 3][..], &big[..1000]] {
            send_raw(a.as_raw_fd(), frame, &[]).unwrap();
            let (got, fds) = recv_raw(b.as_raw_fd()).unwrap().expect("a frame");
            assert_eq!(got.len(), frame.len());
            assert!(got == frame, "frame of {} bytes differs", frame.len());
            assert!(fds.is_empty());
        }
        // An empty frame with an fd is a frame; the end of the peer is `None`.
        let (x, _y) = seqpacket_pair().unwrap();
        send_raw(a.as_raw_fd(), b"", &[x.as_raw_fd()]).unwrap();
        let (got, fds) = recv_raw(b.as_raw_fd()).unwrap().expect("a frame with an fd");
        assert!(got.is_empty());
        assert_eq!(fds.len(), 1);
        drop(a);
        assert!(recv_raw(b.as_raw_fd()).unwrap().is_none(), "the peer is gone");
    }

    #[test]
    fn a_listening_path_appears_ready_and_alone_and_is_never_replaced() {
        let dir = std::env::temp_dir().join(format!("cloister-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broker.sock");
        let _listener = listen_seqpacket(&path).unwrap();
        connect_seqpacket(&path).expect("the path accepts connections as soon as it is there");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("broker.sock")], "the staging name is gone");
        let again = listen_seqpacket(&path).expect_err("a second listener on a taken path");
        assert_eq!(again.kind(), std::io::ErrorKind::AddrInUse);
        connect_seqpacket(&path).expect("the first listener still holds the path");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_path_too_long_to_stage_beside_binds_in_place() {
        let base = std::env::temp_dir().join(format!("cloister-listen-long-{}", std::process::id()));
        // 105 bytes with "/s": fits a sockaddr_un; the staging name beside it does not.
        let pad = 105 - base.as_os_str().len() - "/s".len() - 1;
        let dir = base.join("d".repeat(pad));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        assert!(unix_addr(&path).is_ok());
        let _listener = listen_seqpacket(&path).unwrap();
        connect_seqpacket(&path).expect("bound in place");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(&base);
    }
}
