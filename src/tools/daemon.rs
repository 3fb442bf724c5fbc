//! `softroce daemon`: a long-running peer that serves the pingpong and perftest tools' clients,
//! one after another and several at once, on one device.
//!
//! Each service is a tool in its server role on a TCP port of its own, since neither
//! rdma-core's exchange nor perftest's says which test a client runs; or, for rping and the
//! perftest tools with `-R`, on a port of RDMA-CM's TCP port space (`daemon_cm`).
//! Every accepted connection becomes a session: a thread with its own protection domain, CQs,
//! QPs and buffer on the shared device, which run the tool's server side to the end and then
//! drop them all.
//!
//! A peer that vanishes must cost a session, never the daemon. An RC QP whose sends go
//! unanswered ends in RETRY_EXC_ERR by itself, but a QP waiting on receives hears nothing, so
//! every session's waits are bounded by an idle timeout ([`Limits::idle`]), its TCP reads
//! included. SIGINT and SIGTERM stop the daemon: the listeners close, every session's waits
//! end ([`Limits::stop`]) and its connection is shut down, the threads are joined and the
//! counters printed. SIGUSR1 prints the counters and carries on.
//!
//! The log goes through `tracing`; the counters go to standard output.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use signal_hook_mio::v1_0::Signals;
use tracing::{info, warn};

use super::daemon_cm::{self, Arrival, RoutedRequests, Routes};
use super::{perftest, pingpong, rping, DeviceOptions, Limits, MemoryBudget};
use crate::verbs::{ConnectionRequest, Device};

/// A tool the daemon serves, with the options its clients must match (size, iterations, QPs).
#[derive(Debug, Clone)]
pub enum Service {
    /// `ibv_rc_pingpong`, `ibv_uc_pingpong` or `ibv_ud_pingpong` in the server role, over TCP.
    Pingpong(pingpong::Options),
    /// A perftest `ib_*_bw` or `ib_*_lat` server: over TCP, or RDMA-CM with `-R`.
    Perftest(perftest::Options),
    /// `rping -s`, on RDMA-CM.
    Rping(rping::Options),
}

impl Service {
    /// The tool's name: `rc-pingpong`, `write-bw`.
    pub fn name(&self) -> &'static str {
        match self {
            Service::Pingpong(o) => o.transport.tool_name(),
            Service::Perftest(o) => o.test.name(),
            Service::Rping(_) => "rping",
        }
    }

    /// Whether its clients come by RDMA-CM rather than TCP.
    pub fn is_rdma_cm(&self) -> bool {
        match self {
            Service::Pingpong(_) => false,
            Service::Perftest(o) => o.rdma_cm,
            Service::Rping(_) => true,
        }
    }

    /// The port it listens on (`-p`): a TCP port, or one of RDMA-CM's TCP port space.
    pub fn port(&self) -> u16 {
        match self {
            Service::Pingpong(o) => o.port,
            Service::Perftest(o) => o.port,
            Service::Rping(o) => o.port,
        }
    }

    /// The least a session registers, whatever its client says.
    fn least_memory(&self) -> super::Result<u64> {
        match self {
            Service::Pingpong(o) => Ok(pingpong::buffer_len(o) as u64),
            Service::Perftest(o) => perftest::least_buffer_len(o),
            Service::Rping(o) => Ok(o.size as u64),
        }
    }

    /// Runs the server side for the client on `stream`, writing the tool's output to `out`.
    fn serve(
        &self,
        device: &Device,
        stream: TcpStream,
        limits: &Limits,
        out: &mut dyn Write,
    ) -> super::Result<()> {
        match self {
            Service::Pingpong(o) => pingpong::serve(o, device, stream, limits, out).map(drop),
            Service::Perftest(o) => perftest::serve(o, device, stream, limits, out),
            Service::Rping(_) => Err(super::Error::Usage(
                "rping's clients come by RDMA-CM".into(),
            )),
        }
    }

    /// Runs the server side for the client whose connection `request` asks for; a perftest
    /// `-R` session takes its data connections' requests through `routes`.
    fn serve_cm(
        &self,
        device: &Device,
        (request, routes): (ConnectionRequest, Arc<Routes>),
        limits: &Limits,
        out: &mut dyn Write,
    ) -> super::Result<()> {
        match self {
            Service::Rping(o) => {
                // rping's disconnect lines go with the rest of its output to the log.
                let mut err = Vec::new();
                let served = rping::serve(o, device, request, limits, (out, &mut err));
                out.write_all(&err)?;
                served
            }
            Service::Perftest(o) => {
                let mut data = RoutedRequests::new(routes, limits);
                perftest::serve_rdma_cm(o, device, (request, &mut data), limits, out)
            }
            Service::Pingpong(_) => Err(super::Error::Usage(
                "the pingpong tools' clients come by TCP".into(),
            )),
        }
    }
}

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The device: `bind`, its address, is required.
    pub device: DeviceOptions,
    /// The tools served, each on a port of its own.
    pub services: Vec<Service>,
    /// How long a session may hear nothing from its peer.
    pub idle: Duration,
    /// Sessions at once; a connection beyond them is closed at once, and logged.
    pub max_sessions: usize,
    /// The most memory one session, and all of them together, may register ([`MemoryBudget`]).
    pub max_session_memory: u64,
    /// The most all sessions together may register, in bytes (`--max-memory`).
    pub max_memory: u64,
}

/// What the daemon has done since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Sessions started.
    pub accepted: u64,
    /// Sessions whose server side ran to the end.
    pub succeeded: u64,
    /// Sessions that failed, or could not start.
    pub failed: u64,
    /// Connections closed at once: `max_sessions` were running.
    pub refused: u64,
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sessions: accepted {} succeeded {} failed {} refused {}",
            self.accepted, self.succeeded, self.failed, self.refused
        )
    }
}

const SIGNALS: Token = Token(usize::MAX);
const WAKER: Token = Token(usize::MAX - 1);

/// A session's thread, and its TCP connection if it has one, to shut down when the daemon
/// stops (an RDMA-CM session's waits end by the stop flag alone).
struct Running {
    thread: JoinHandle<()>,
    stream: Option<TcpStream>,
}

/// What a session's thread reports when it ends.
struct Ended {
    id: u64,
    outcome: super::Result<()>,
}

/// Runs until SIGINT or SIGTERM; returns what it did. Logs "ready" once every listener is up.
pub fn run(o: &Options) -> io::Result<Tally> {
    let usage = |why: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    if o.services.is_empty() {
        return usage("no service to serve: give at least one --serve");
    }
    let Some(address) = o.device.bind else {
        return usage("the daemon's device needs an address: give --bind");
    };
    let memory = Arc::new(MemoryBudget::new(o.max_session_memory, o.max_memory));
    for service in &o.services {
        let refused = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
        let least = service
            .least_memory()
            .map_err(|e| refused(format!("{}: {e}", service.name())))?;
        memory.check_session(least).map_err(|e| {
            refused(format!(
                "{} on port {}: {e}",
                service.name(),
                service.port()
            ))
        })?;
    }
    let device = o
        .device
        .open(address)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let listeners = o
        .services
        .iter()
        .map(|service| {
            if service.is_rdma_cm() {
                return Ok(None);
            }
            // As the tool's own server listens: on every address of the device's family.
            let listener = pingpong::listen(service.port(), Some(address))
                .map_err(|e| io::Error::other(format!("{}: {e}", service.name())))?;
            listener.set_nonblocking(true)?;
            Ok(Some(listener))
        })
        .collect::<io::Result<Vec<_>>>()?;
    let mut poll = Poll::new()?;
    for (index, listener) in listeners.iter().enumerate() {
        let Some(listener) = listener else { continue };
        poll.registry().register(
            &mut SourceFd(&listener.as_raw_fd()),
            Token(index),
            Interest::READABLE,
        )?;
    }
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGUSR1])?;
    poll.registry()
        .register(&mut signals, SIGNALS, Interest::READABLE)?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let stop = Arc::new(AtomicBool::new(false));
    let routes = Arc::new(Routes::default());
    let (arrivals, arrived) = unbounded();
    let mut cm_threads = Vec::new();
    for (index, service) in o.services.iter().enumerate() {
        if !service.is_rdma_cm() {
            continue;
        }
        let listener = device.listen(service.port()).map_err(|e| {
            io::Error::other(format!(
                "{}: RDMA-CM port {}: {e}",
                service.name(),
                service.port()
            ))
        })?;
        let feed = (arrivals.clone(), waker.clone());
        let thread =
            daemon_cm::spawn_listener((index, listener), routes.clone(), feed, stop.clone())?;
        cm_threads.push(thread);
    }
    info!(%address, backend = ?o.device.backend, idle_s = o.idle.as_secs_f32(),
          max_sessions = o.max_sessions, "device open");
    for service in &o.services {
        info!(service = service.name(), port = service.port(), "serving");
    }
    info!("ready");

    let mut daemon = Daemon {
        o,
        device,
        limits: Limits {
            idle: Some(o.idle),
            stop: Some(stop.clone()),
            memory: Some(memory),
        },
        routes,
        waker,
        ended: unbounded(),
        running: HashMap::new(),
        next_id: 1,
        tally: Tally::default(),
        started: Instant::now(),
    };
    let mut events = Events::with_capacity(64);
    'serve: loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for event in &events {
            match event.token() {
                SIGNALS => {
                    for signal in signals.pending() {
                        if signal == SIGUSR1 {
                            daemon.print_counters("on request (SIGUSR1)");
                        } else {
                            let name = if signal == SIGINT {
                                "SIGINT"
                            } else {
                                "SIGTERM"
                            };
                            info!(signal = name, "stopping");
                            break 'serve;
                        }
                    }
                }
                WAKER => {
                    while let Ok(Arrival { service, request }) = arrived.try_recv() {
                        daemon.accept_cm(&o.services[service], request);
                    }
                }
                Token(index) => {
                    if let Some(listener) = &listeners[index] {
                        daemon.accept(&o.services[index], listener);
                    }
                }
            }
        }
        daemon.reap();
    }
    drop(listeners);
    daemon.stop();
    for thread in cm_threads {
        let _ = thread.join();
    }
    daemon.print_counters("at exit");
    Ok(daemon.tally)
}

struct Daemon<'o> {
    o: &'o Options,
    device: Device,
    limits: Limits,
    /// Where the perftest `-R` sessions' data connections go.
    routes: Arc<Routes>,
    waker: Arc<Waker>,
    ended: (Sender<Ended>, Receiver<Ended>),
    running: HashMap<u64, Running>,
    next_id: u64,
    tally: Tally,
    started: Instant,
}

impl Daemon<'_> {
    /// Takes every connection waiting on `listener` and starts a session for each.
    fn accept(&mut self, service: &Service, listener: &TcpListener) {
        loop {
            let (stream, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // Out of descriptors, or the connection was reset before it was taken: the
                    // listener itself is fine.
                    warn!(service = service.name(), error = %e, "accept failed");
                    return;
                }
            };
            self.reap();
            if self.running.len() >= self.o.max_sessions {
                self.tally.refused += 1;
                warn!(service = service.name(), %peer, max_sessions = self.o.max_sessions,
                      "refused: as many sessions as allowed are running");
                continue;
            }
            if let Err(e) = self.start(service, stream, peer) {
                self.tally.failed += 1;
                warn!(service = service.name(), %peer, error = %e, "could not start a session");
            }
        }
    }

    /// A client of an RDMA-CM service: a session for it, or, when as many run as allowed, its
    /// request dropped, which rejects it.
    fn accept_cm(&mut self, service: &Service, request: ConnectionRequest) {
        self.reap();
        let peer = request.peer();
        if self.running.len() >= self.o.max_sessions {
            self.tally.refused += 1;
            warn!(service = service.name(), %peer, max_sessions = self.o.max_sessions,
                  "refused: as many sessions as allowed are running");
            return;
        }
        let routes = self.routes.clone();
        let started =
            self.start_session(service, peer, None, move |service, device, limits, out| {
                service.serve_cm(device, (request, routes), limits, out)
            });
        if let Err(e) = started {
            self.tally.failed += 1;
            warn!(service = service.name(), %peer, error = %e, "could not start a session");
        }
    }

    fn start(&mut self, service: &Service, stream: TcpStream, peer: SocketAddr) -> io::Result<()> {
        stream.set_nonblocking(false)?;
        let kept = stream.try_clone()?;
        self.start_session(
            service,
            peer,
            Some(kept),
            move |service, device, limits, out| service.serve(device, stream, limits, out),
        )
    }

    /// Starts a session's thread, which runs `serve` and logs the tool's output.
    fn start_session(
        &mut self,
        service: &Service,
        peer: SocketAddr,
        stream: Option<TcpStream>,
        serve: impl FnOnce(&Service, &Device, &Limits, &mut dyn Write) -> super::Result<()>
            + Send
            + 'static,
    ) -> io::Result<()> {
        let (id, name) = (self.next_id, service.name());
        self.next_id += 1;
        self.tally.accepted += 1;
        info!(session = id, service = name, %peer, "session starts");
        let (service, device, limits) = (service.clone(), self.device.clone(), self.limits.clone());
        let (ended, waker) = (self.ended.0.clone(), self.waker.clone());
        let thread = std::thread::Builder::new()
            .name(format!("session-{id}"))
            .spawn(move || {
                let mut output = Vec::new();
                let outcome = serve(&service, &device, &limits, &mut output);
                for line in String::from_utf8_lossy(&output).lines() {
                    info!(session = id, service = name, "{}", line.trim_end());
                }
                let _ = ended.send(Ended { id, outcome });
                let _ = waker.wake();
            })?;
        self.running.insert(id, Running { thread, stream });
        Ok(())
    }

    /// Joins the sessions that have ended, and logs how.
    fn reap(&mut self) {
        while let Ok(Ended { id, outcome }) = self.ended.1.try_recv() {
            if let Some(running) = self.running.remove(&id) {
                if running.thread.join().is_err() {
                    warn!(session = id, "session thread panicked");
                }
            }
            match outcome {
                Ok(()) => {
                    self.tally.succeeded += 1;
                    info!(session = id, "session ends");
                }
                Err(e) => {
                    self.tally.failed += 1;
                    warn!(session = id, error = %e, "session failed; its QPs are destroyed");
                }
            }
        }
    }

    /// Ends every session: their waits fail at once, their connections are shut down.
    fn stop(&mut self) {
        if let Some(stop) = &self.limits.stop {
            stop.store(true, Ordering::Relaxed);
        }
        for running in self.running.values() {
            if let Some(stream) = &running.stream {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        let running = std::mem::take(&mut self.running);
        for (id, running) in running {
            if running.thread.join().is_err() {
                warn!(session = id, "session thread panicked");
            }
        }
        self.reap();
    }

    fn print_counters(&mut self, when: &str) {
        self.reap();
        let mut out = io::stdout().lock();
        let _ = writeln!(
            out,
            "softroce daemon counters {when}, after {:.1} s:\n{}, running {}",
            self.started.elapsed().as_secs_f64(),
            self.tally,
            self.running.len()
        );
        let memory = self.limits.memory.as_ref().map_or(0, |m| m.used());
        let _ = writeln!(
            out,
            "memory: {memory} bytes held by sessions, of {} (--max-memory)",
            self.o.max_memory
        );
        match (self.device.resources(), self.device.counters()) {
            (Ok(resources), Ok((core, io))) => {
                let _ = write!(out, "resources: {resources}\n{core}io: {io:?}\n");
            }
            (Err(e), _) | (_, Err(e)) => {
                let _ = writeln!(out, "the device's counters: {e}");
            }
        }
        match self.device.congestion() {
            Ok(qps) => {
                for (qpn, status) in qps {
                    let _ = writeln!(out, "congestion: QP {qpn:?}: {status}");
                }
            }
            Err(e) => {
                let _ = writeln!(out, "the device's congestion control: {e}");
            }
        }
        let _ = out.flush();
    }
}
