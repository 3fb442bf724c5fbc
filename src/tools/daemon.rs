//! `softroce daemon`: a long-running peer that serves the pingpong and perftest tools' clients,
//! one after another and several at once, on one device.
//!
//! Each service is a tool in its server role on a TCP port of its own, since neither
//! rdma-core's exchange nor perftest's says which test a client runs. Every accepted
//! connection becomes a session: a thread with its own protection domain, CQs, QPs and buffer
//! on the shared device, which run the tool's server side to the end and then drop them all.
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

use super::{perftest, pingpong, DeviceOptions, Limits, MemoryBudget};
use crate::verbs::Device;

/// A tool the daemon serves, with the options its clients must match (size, iterations, QPs).
#[derive(Debug, Clone)]
pub enum Service {
    Pingpong(pingpong::Options),
    Perftest(perftest::Options),
}

impl Service {
    /// The tool's name: `rc-pingpong`, `write-bw`.
    pub fn name(&self) -> &'static str {
        match self {
            Service::Pingpong(o) => o.transport.tool_name(),
            Service::Perftest(o) => o.test.name(),
        }
    }

    pub fn port(&self) -> u16 {
        match self {
            Service::Pingpong(o) => o.port,
            Service::Perftest(o) => o.port,
        }
    }

    /// The least a session registers, whatever its client says.
    fn least_memory(&self) -> super::Result<u64> {
        match self {
            Service::Pingpong(o) => Ok(pingpong::buffer_len(o) as u64),
            Service::Perftest(o) => perftest::least_buffer_len(o),
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
        }
    }
}

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The device: `bind`, its address, is required.
    pub device: DeviceOptions,
    pub services: Vec<Service>,
    /// How long a session may hear nothing from its peer.
    pub idle: Duration,
    /// Sessions at once; a connection beyond them is closed at once, and logged.
    pub max_sessions: usize,
    /// The most memory one session, and all of them together, may register ([`MemoryBudget`]).
    pub max_session_memory: u64,
    pub max_memory: u64,
}

/// What the daemon has done since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub accepted: u64,
    pub succeeded: u64,
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

/// A session's thread, and its connection, to shut down when the daemon stops.
struct Running {
    thread: JoinHandle<()>,
    stream: TcpStream,
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
            // As the tool's own server listens: on every address of the device's family.
            let listener = pingpong::listen(service.port(), Some(address))
                .map_err(|e| io::Error::other(format!("{}: {e}", service.name())))?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .collect::<io::Result<Vec<_>>>()?;
    let mut poll = Poll::new()?;
    for (index, listener) in listeners.iter().enumerate() {
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
            stop: Some(Arc::new(AtomicBool::new(false))),
            memory: Some(memory),
        },
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
                WAKER => {}
                Token(index) => daemon.accept(&o.services[index], &listeners[index]),
            }
        }
        daemon.reap();
    }
    drop(listeners);
    daemon.stop();
    daemon.print_counters("at exit");
    Ok(daemon.tally)
}

struct Daemon<'o> {
    o: &'o Options,
    device: Device,
    limits: Limits,
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

    fn start(&mut self, service: &Service, stream: TcpStream, peer: SocketAddr) -> io::Result<()> {
        stream.set_nonblocking(false)?;
        let kept = stream.try_clone()?;
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
                let outcome = service.serve(&device, stream, &limits, &mut output);
                for line in String::from_utf8_lossy(&output).lines() {
                    info!(session = id, service = name, "{}", line.trim_end());
                }
                let _ = ended.send(Ended { id, outcome });
                let _ = waker.wake();
            })?;
        self.running.insert(
            id,
            Running {
                thread,
                stream: kept,
            },
        );
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
            let _ = running.stream.shutdown(Shutdown::Both);
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
        let _ = out.flush();
    }
}
