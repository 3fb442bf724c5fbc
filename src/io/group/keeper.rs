//! Every member keeps a descriptor of every socket of its group, so that a socket outlives the
//! member it was made for: the kernel numbers a reuse-port group's sockets in the order they
//! joined, and when one closes it moves the last into its place (`reuseport_detach_sock`),
//! which would send the last member's packets to a place that is not its own. A socket kept by
//! the others stays in its place when its member dies; the next member to take the place takes
//! the socket with it, and reads what waited there (packets for QPs that are gone, dropped and
//! counted as any packet for an unknown QP).
//!
//! Sockets go from member to member over a Unix socket in the abstract namespace (which, as
//! UDP ports, belongs to the network namespace), named by the user, address and place. Each
//! member answers on one with a thread that sleeps in `poll` until asked, and answers only a
//! process of its own user (`SO_PEERCRED`): the kernel admits only that user to the UDP group.
//!
//! The exchange: `GIVE` is answered with one message per kept socket, its place in a byte and
//! the socket as `SCM_RIGHTS`, then an empty message; `KEEP` and a place, with a socket, is
//! answered `OK` once kept.

use std::collections::BTreeMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// How long a member waits for another to answer: one stopped in a debugger is skipped.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// How long a new member of a place waits for the name of the one before to be free.
const NAME_FREED_WITHIN: Duration = Duration::from_secs(1);
/// The last message of an answer to `GIVE`.
const END: &[u8] = b"END";

/// The sockets a member keeps, by place.
pub type Kept = Arc<Mutex<BTreeMap<u8, OwnedFd>>>;

pub fn lock(kept: &Kept) -> MutexGuard<'_, BTreeMap<u8, OwnedFd>> {
    kept.lock().unwrap_or_else(|p| p.into_inner())
}

/// The name a member of `place` answers on.
fn name(address: IpAddr, place: u8) -> io::Result<SocketAddrUnix> {
    let uid = nix::unistd::geteuid().as_raw();
    SocketAddrUnix::new_abstract_name(format!("softroce/{uid}/{address}/{place}").as_bytes())
        .map_err(io::Error::from)
}

/// A member's answering thread.
#[derive(Debug)]
pub struct Keeper {
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl Keeper {
    /// Answers, as the member of `place`, for the sockets in `kept`. Fails if another process
    /// answers for the place already.
    pub fn start(address: IpAddr, place: u8, kept: Kept) -> io::Result<Keeper> {
        let listener = net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        // The member before, killed, may still be closing its name (its byte lock, on a
        // descriptor closed first, freed the place a moment before).
        let deadline = Instant::now() + NAME_FREED_WITHIN;
        loop {
            match net::bind(&listener, &name(address, place)?) {
                Ok(()) => break,
                Err(rustix::io::Errno::ADDRINUSE) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("another process answers for place {place} of {address}: {e}"),
                    ))
                }
            }
        }
        net::listen(&listener, 16)?;
        let stop = Arc::new(eventfd(0, EventfdFlags::CLOEXEC)?);
        let woken = stop.clone();
        let thread = std::thread::Builder::new()
            // "srg" and the address, as the engines' "sr" (`engine::ThreadName`): the kernel
            // keeps 15 bytes of a name.
            .name(format!("srg {address}"))
            .spawn(move || {
                crate::engine::hold_signals_off_for_good();
                answer(&listener, &woken, &kept)
            })?;
        Ok(Keeper {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The answering thread: sleeps until asked or stopped.
fn answer(listener: &OwnedFd, stop: &OwnedFd, kept: &Kept) {
    let uid = nix::unistd::geteuid().as_raw();
    loop {
        let mut fds = [
            PollFd::new(listener, PollFlags::IN),
            PollFd::new(stop, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        let Ok(conn) = net::accept_with(listener, SocketFlags::CLOEXEC) else {
            // Out of descriptors, say: not a reason to spin.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let peer = net::sockopt::socket_peercred(&conn).ok();
        if peer.is_some_and(|cred| cred.uid.as_raw() == uid) {
            let _ = net::sockopt::set_socket_timeout(
                &conn,
                net::sockopt::Timeout::Recv,
                Some(ANSWER_WITHIN),
            );
            let _ = net::sockopt::set_socket_timeout(
                &conn,
                net::sockopt::Timeout::Send,
                Some(ANSWER_WITHIN),
            );
            let _ = serve(&conn, kept);
        }
    }
}

fn serve(conn: &OwnedFd, kept: &Kept) -> io::Result<()> {
    let mut request = [0u8; 8];
    let (len, socket) = receive(conn, &mut request)?;
    match (&request[..len], socket) {
        (b"GIVE", _) => {
            // Duplicated first, so that no lock is held while a slow peer reads.
            let copies = lock(kept)
                .iter()
                .map(|(&place, fd)| Ok((place, fd.try_clone()?)))
                .collect::<io::Result<Vec<_>>>()?;
            for (place, fd) in &copies {
                send(conn, &[*place], Some(fd.as_fd()))?;
            }
            send(conn, END, None)
        }
        ([b'K', b'E', b'E', b'P', place], Some(socket)) => {
            lock(kept).insert(*place, socket);
            send(conn, b"OK", None)
        }
        _ => Ok(()),
    }
}

fn send(
    conn: &OwnedFd,
    bytes: &[u8],
    socket: Option<std::os::fd::BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(socket) = socket {
        fds = [socket];
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    net::sendmsg(
        conn,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receives one message into `bytes`: its length, and the socket it carried, if any.
fn receive(conn: &OwnedFd, bytes: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = net::recvmsg(
        conn,
        &mut [IoSliceMut::new(bytes)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut socket = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            // Any beyond the first are closed as the iterator drops them.
            for fd in fds {
                socket.get_or_insert(fd);
            }
        }
    }
    Ok((received.bytes, socket))
}

/// Connects to the member of `place`, as this user.
fn connect(address: IpAddr, place: u8) -> io::Result<OwnedFd> {
    let conn = net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    net::sockopt::set_socket_timeout(&conn, net::sockopt::Timeout::Recv, Some(ANSWER_WITHIN))?;
    net::sockopt::set_socket_timeout(&conn, net::sockopt::Timeout::Send, Some(ANSWER_WITHIN))?;
    net::connect(&conn, &name(address, place)?)?;
    // Abstract names are anyone's to bind: answer only a process of this user.
    let peer = net::sockopt::socket_peercred(&conn)?;
    if peer.uid.as_raw() != nix::unistd::geteuid().as_raw() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("place {place} of {address} is answered by another user's process"),
        ));
    }
    Ok(conn)
}

/// Every socket the member of `place` keeps, by place.
pub fn ask_for_sockets(address: IpAddr, place: u8) -> io::Result<BTreeMap<u8, OwnedFd>> {
    let conn = connect(address, place)?;
    send(&conn, b"GIVE", None)?;
    let mut sockets = BTreeMap::new();
    loop {
        let mut message = [0u8; 4];
        match receive(&conn, &mut message)? {
            (3, None) if &message[..3] == END => return Ok(sockets),
            (1, Some(socket)) => {
                sockets.insert(message[0], socket);
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("the member of place {place} answered out of turn"),
                ))
            }
        }
    }
}

/// Has the member of `place` keep `socket`, the socket of place `of`.
pub fn have_kept(address: IpAddr, place: u8, of: u8, socket: &OwnedFd) -> io::Result<()> {
    let conn = connect(address, place)?;
    send(&conn, &[b'K', b'E', b'E', b'P', of], Some(socket.as_fd()))?;
    let mut answer = [0u8; 2];
    match receive(&conn, &mut answer)? {
        (2, None) if &answer == b"OK" => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the member of place {place} did not keep the socket"),
        )),
    }
}
