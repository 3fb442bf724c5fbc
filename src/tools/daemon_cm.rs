//! The daemon's RDMA-CM services: `rping -s` and the perftest tools with `-R`. Their clients
//! arrive as connection requests on the device's CM, not on a TCP listener: a thread per
//! service takes them from its [`Listener`] and hands them to the daemon's loop, which starts a
//! session for each as for a TCP client.
//!
//! A perftest `-R` client connects more than once on the one port: its control connection,
//! then one per data QP. A session that expects its client's data connections says so
//! ([`Routes::expect`]) before the round that lets the client make them, and the listener's
//! thread hands it the next requests from that client's address instead of starting new
//! sessions. A second client from the same address starting in that instant would have its
//! control connection taken as a data connection; it is a window of one round trip.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use mio::Waker;
use tracing::warn;

use super::perftest_cm::DataRequests;
use super::{Error, Limits, Result};
use crate::verbs::{ConnectionRequest, Listener};

/// How often a listener's thread and a session waiting for data connections look whether the
/// daemon is stopping.
const TICK: Duration = Duration::from_millis(200);

/// A client's request for a CM service, for the daemon's loop.
pub(super) struct Arrival {
    /// The service's index in the daemon's `Options::services`.
    pub service: usize,
    /// The client's connection request, to accept or drop.
    pub request: ConnectionRequest,
}

/// Which sessions expect more connections from which client address, and how many.
#[derive(Default)]
pub(super) struct Routes {
    waiting: Mutex<HashMap<IpAddr, (Sender<ConnectionRequest>, usize)>>,
}

impl Routes {
    /// `count` more requests from `peer` go to `to`.
    fn expect(&self, peer: IpAddr, count: usize, to: Sender<ConnectionRequest>) {
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.insert(peer, (to, count));
        }
    }

    /// Where the next request from `peer` goes, if a session expects it.
    fn take(&self, peer: IpAddr) -> Option<Sender<ConnectionRequest>> {
        let mut waiting = self.waiting.lock().ok()?;
        let (to, left) = waiting.get_mut(&peer)?;
        let to = to.clone();
        *left -= 1;
        if *left == 0 {
            waiting.remove(&peer);
        }
        Some(to)
    }

    /// The session whose channel `to` is has ended: nothing more goes to it.
    fn forget(&self, peer: IpAddr, to: &Sender<ConnectionRequest>) {
        if let Ok(mut waiting) = self.waiting.lock() {
            if waiting.get(&peer).is_some_and(|(s, _)| s.same_channel(to)) {
                waiting.remove(&peer);
            }
        }
    }
}

/// Takes `listener`'s requests until `stop`: those a session expects go to it, the others to
/// the daemon's loop as new clients of service `service`.
pub(super) fn spawn_listener(
    (service, listener): (usize, Listener),
    routes: Arc<Routes>,
    (arrivals, waker): (Sender<Arrival>, Arc<Waker>),
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("cm-listener-{}", listener.port()))
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let request = match listener.next_request(TICK) {
                    Ok(Some(request)) => request,
                    Ok(None) => continue,
                    Err(e) => {
                        warn!(port = listener.port(), error = %e, "the CM listener stops");
                        return;
                    }
                };
                let peer = request.peer().ip();
                // A session's data connection, or a new client.
                let request = match routes.take(peer) {
                    Some(session) => match session.send(request) {
                        Ok(()) => continue,
                        Err(unwanted) => unwanted.into_inner(),
                    },
                    None => request,
                };
                if arrivals.send(Arrival { service, request }).is_err() {
                    return;
                }
                let _ = waker.wake();
            }
        })
}

/// A served perftest `-R` session's data connection requests, as the listener's thread routes
/// them.
pub(super) struct RoutedRequests {
    routes: Arc<Routes>,
    peer: Option<IpAddr>,
    to: Sender<ConnectionRequest>,
    from: Receiver<ConnectionRequest>,
    limits: Limits,
}

impl RoutedRequests {
    pub(super) fn new(routes: Arc<Routes>, limits: &Limits) -> Self {
        let (to, from) = bounded(64);
        RoutedRequests {
            routes,
            peer: None,
            to,
            from,
            limits: limits.clone(),
        }
    }
}

impl DataRequests for RoutedRequests {
    fn expect(&mut self, peer: IpAddr, count: usize) {
        self.peer = Some(peer);
        self.routes.expect(peer, count, self.to.clone());
    }

    fn next(&mut self) -> Result<ConnectionRequest> {
        let started = Instant::now();
        loop {
            if let Ok(request) = self.from.recv_timeout(TICK) {
                return Ok(request);
            }
            self.limits.check_since(started).map_err(|e| match e {
                Error::PeerSilent(idle) => Error::Exchange(format!(
                    "the client made no data connection for {} s",
                    idle.as_secs_f32()
                )),
                other => other,
            })?;
        }
    }
}

impl Drop for RoutedRequests {
    fn drop(&mut self) {
        if let Some(peer) = self.peer {
            self.routes.forget(peer, &self.to);
        }
    }
}
