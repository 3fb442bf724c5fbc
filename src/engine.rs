//! The engine: one progress thread per device, driving the sans-IO core from a [`Backend`] and
//! the clock. With the io layer, it is the only code that makes syscalls or reads the clock.
//!
//! The application talks to it through lock-free crossbeam channels and wakes it with a mio
//! [`Waker`]: commands (create, modify, register) carry a one-shot reply channel; posted work
//! requests go through a bounded channel per QP, so posting never takes a lock; completions
//! come back through a bounded channel per completion queue, which the application polls or
//! waits on. Every queue is bounded: the core's queues by the sizes the application chose, the
//! channels by the same sizes, and a completion that finds its channel full waits in the core's
//! completion queue, whose overflow raises a CQ overrun event.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError, TrySendError};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::io::{Backend, IoCounters};
use crate::memory::{Access, MemoryError, MemoryRegion, PdId};
use crate::transport::{
    AddressHandle, AddressVector, AsyncEvent, Counters, CqId, Endpoint, EndpointConfig, QpAttr,
    QpInit, RecvWr, Resources, SendWr, SrqAttr, SrqId, SrqModify, VerbsError, WcOpcode, WcStatus,
    WorkCompletion,
};
use crate::wire::{LKey, Qpn};

const SOCKET: Token = Token(0);
const WAKE: Token = Token(1);
/// Datagrams handled per turn of the loop before the engine transmits what they caused.
const RECEIVE_BUDGET: usize = 64;
/// Packets sent per turn of the loop, so that a long READ response does not keep the engine
/// from receiving.
const TRANSMIT_BUDGET: usize = 256;
/// Async events kept for the application before the oldest are dropped.
const EVENT_QUEUE: usize = 256;

/// The reply side of a command.
pub(crate) type Reply<T> = Sender<T>;

/// What the application asks of the engine thread.
pub(crate) enum Command {
    AllocPd(Reply<PdId>),
    RegMr {
        pd: PdId,
        len: usize,
        access: Access,
        reply: Reply<Result<MemoryRegion, MemoryError>>,
    },
    DeregMr(LKey, Reply<Result<(), MemoryError>>),
    CreateCq {
        capacity: usize,
        reply: Reply<(CqId, Receiver<WorkCompletion>)>,
    },
    CreateQp {
        init: QpInit,
        srq: Option<SrqId>,
        reply: Reply<Result<(Qpn, QpQueues), VerbsError>>,
    },
    CreateAh(PdId, AddressVector, Reply<AddressHandle>),
    CreateSrq(PdId, SrqAttr, Reply<Result<SrqId, VerbsError>>),
    ModifySrq(SrqId, SrqModify, Reply<Result<(), VerbsError>>),
    PostSrqRecv(SrqId, RecvWr, Reply<Result<(), VerbsError>>),
    ModifyQp(Qpn, Box<QpAttr>, Reply<Result<(), VerbsError>>),
    DestroyQp(Qpn, Reply<Result<(), VerbsError>>),
    DestroyCq(CqId, Reply<Result<(), VerbsError>>),
    DestroyAh(AddressHandle, Reply<Result<(), VerbsError>>),
    Stats(Reply<(Counters, IoCounters)>),
    Resources(Reply<Resources>),
    Shutdown,
}

/// The application's ends of a QP's posting channels.
#[derive(Debug, Clone)]
pub(crate) struct QpQueues {
    pub send: Sender<SendWr>,
    pub recv: Sender<RecvWr>,
}

/// The engine's ends.
struct QpPosts {
    send: Receiver<SendWr>,
    recv: Receiver<RecvWr>,
}

/// The application's side of a running engine.
pub(crate) struct EngineHandle {
    pub commands: Sender<Command>,
    pub waker: Arc<Waker>,
    pub events: Receiver<AsyncEvent>,
    pub thread: Option<JoinHandle<io::Result<()>>>,
}

impl EngineHandle {
    /// Sends a command and wakes the engine.
    pub fn command(&self, command: Command) -> Result<(), EngineGone> {
        self.commands.send(command).map_err(|_| EngineGone)?;
        self.waker.wake().map_err(|_| EngineGone)
    }

    /// Sends a command built around a reply channel, and waits for the reply.
    pub fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, EngineGone> {
        let (reply, answer) = bounded(1);
        self.command(make(reply))?;
        answer.recv().map_err(|_| EngineGone)
    }
}

/// The engine thread has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineGone;

struct Engine<B: Backend> {
    endpoint: Endpoint,
    backend: B,
    start: Instant,
    commands: Receiver<Command>,
    qps: HashMap<Qpn, QpPosts>,
    /// Indexed by CQ number; `None` where a CQ was destroyed.
    cqs: Vec<Option<Sender<WorkCompletion>>>,
    events: Sender<AsyncEvent>,
    /// The next address handed to a registered region: regions never overlap, so an address
    /// names one region, as it does in a process's address space.
    next_iova: u64,
}

/// Starts the engine thread of a device.
pub(crate) fn spawn<B: Backend>(backend: B, seed: u64) -> io::Result<EngineHandle> {
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
    let (commands, command_rx) = crossbeam_channel::unbounded();
    let (event_tx, events) = bounded(EVENT_QUEUE);
    let local_addr = backend.local_addr();
    let engine = Engine {
        endpoint: Endpoint::new(EndpointConfig { local_addr, seed }),
        backend,
        start: Instant::now(),
        commands: command_rx,
        qps: HashMap::new(),
        cqs: Vec::new(),
        events: event_tx,
        next_iova: 0x1000_0000,
    };
    let thread = std::thread::Builder::new()
        .name(format!("softroce {local_addr}"))
        .spawn(move || engine.run(poll))?;
    Ok(EngineHandle {
        commands,
        waker,
        events,
        thread: Some(thread),
    })
}

impl<B: Backend> Engine<B> {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn run(mut self, mut poll: Poll) -> io::Result<()> {
        poll.registry()
            .register(self.backend.source(), SOCKET, Interest::READABLE)?;
        let mut events = Events::with_capacity(64);
        // Whether the socket may still hold datagrams (readiness is edge-triggered) or packets
        // are still waiting to be sent: then the engine must not sleep.
        let mut backlog = false;
        loop {
            let timeout = if backlog {
                Some(Duration::ZERO)
            } else {
                self.endpoint
                    .next_deadline()
                    .map(|deadline| deadline.saturating_sub(self.now()))
            };
            match poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            if !self.commands()? {
                self.shut_down();
                return Ok(());
            }
            self.posts();
            let now = self.now();
            let endpoint = &mut self.endpoint;
            let received = self.backend.receive(RECEIVE_BUDGET, &mut |datagram| {
                endpoint.handle_received(now, datagram)
            })?;
            backlog = received == RECEIVE_BUDGET;
            if self.endpoint.next_deadline().is_some_and(|d| d <= now) {
                self.endpoint.handle_timeout(now);
            }
            let more_to_send = self.transmit()?;
            backlog |= more_to_send;
            self.completions();
        }
    }

    /// Runs the queued commands; false once shutdown is asked for.
    fn commands(&mut self) -> io::Result<bool> {
        loop {
            let command = match self.commands.try_recv() {
                Ok(command) => command,
                Err(TryRecvError::Empty) => return Ok(true),
                // Every application handle is gone: stop.
                Err(TryRecvError::Disconnected) => return Ok(false),
            };
            let now = self.now();
            // A reply whose caller has gone away is of no interest: sends are not checked.
            match command {
                Command::AllocPd(reply) => {
                    let _ = reply.send(self.endpoint.alloc_pd());
                }
                Command::RegMr {
                    pd,
                    len,
                    access,
                    reply,
                } => {
                    let iova = self.next_iova;
                    let result = self.endpoint.reg_mr(pd, iova, len, access);
                    if result.is_ok() {
                        // Keep regions page-aligned and apart.
                        self.next_iova += (len as u64).div_ceil(4096).max(1) * 4096;
                    }
                    let _ = reply.send(result);
                }
                Command::DeregMr(lkey, reply) => {
                    let _ = reply.send(self.endpoint.dereg_mr(lkey));
                }
                Command::CreateCq { capacity, reply } => {
                    let cq = self.endpoint.create_cq(capacity);
                    let (tx, rx) = bounded(capacity.max(1));
                    // The core reuses a destroyed CQ's number, and so its slot here.
                    let slot = cq.0 as usize;
                    if slot == self.cqs.len() {
                        self.cqs.push(Some(tx));
                    } else {
                        self.cqs[slot] = Some(tx);
                    }
                    let _ = reply.send((cq, rx));
                }
                Command::CreateQp { init, srq, reply } => {
                    let created = match srq {
                        Some(srq) => self.endpoint.create_qp_with_srq(init, srq),
                        None => self.endpoint.create_qp(init),
                    };
                    let result = created.map(|qpn| {
                        let (send, send_rx) = bounded(init.max_send_wr.max(1));
                        let (recv, recv_rx) = bounded(init.max_recv_wr.max(1));
                        self.qps.insert(
                            qpn,
                            QpPosts {
                                send: send_rx,
                                recv: recv_rx,
                            },
                        );
                        (qpn, QpQueues { send, recv })
                    });
                    let _ = reply.send(result);
                }
                Command::CreateAh(pd, av, reply) => {
                    let _ = reply.send(self.endpoint.create_ah(pd, av));
                }
                Command::CreateSrq(pd, attr, reply) => {
                    let _ = reply.send(self.endpoint.create_srq(pd, attr));
                }
                Command::ModifySrq(srq, change, reply) => {
                    let _ = reply.send(self.endpoint.modify_srq(srq, &change));
                }
                Command::PostSrqRecv(srq, wr, reply) => {
                    let _ = reply.send(self.endpoint.post_srq_recv(srq, wr));
                }
                Command::ModifyQp(qpn, attr, reply) => {
                    let _ = reply.send(self.endpoint.modify_qp(now, qpn, &attr));
                }
                Command::DestroyQp(qpn, reply) => {
                    self.qps.remove(&qpn);
                    let _ = reply.send(self.endpoint.destroy_qp(now, qpn));
                }
                Command::DestroyCq(cq, reply) => {
                    let destroyed = self.endpoint.destroy_cq(cq);
                    if destroyed.is_ok() {
                        self.cqs[cq.0 as usize] = None;
                    }
                    let _ = reply.send(destroyed);
                }
                Command::DestroyAh(ah, reply) => {
                    let _ = reply.send(self.endpoint.destroy_ah(ah));
                }
                Command::Resources(reply) => {
                    let _ = reply.send(self.endpoint.resources());
                }
                Command::Stats(reply) => {
                    let _ = reply.send((self.endpoint.counters().clone(), self.backend.counters()));
                }
                Command::Shutdown => return Ok(false),
            }
        }
    }

    /// Moves posted work requests into the core, as far as its queues have room. A request the
    /// core refuses completes with LOC_QP_OP_ERR, since `post_send` has already returned.
    fn posts(&mut self) {
        let now = self.now();
        for (&qpn, posts) in &self.qps {
            for _ in 0..self.endpoint.recv_queue_room(qpn) {
                let Ok(wr) = posts.recv.try_recv() else { break };
                if self.endpoint.post_recv(qpn, wr.clone()).is_err() {
                    self.refused(qpn, wr.wr_id, WcOpcode::Recv);
                }
            }
            for _ in 0..self.endpoint.send_queue_room(qpn) {
                let Ok(wr) = posts.send.try_recv() else { break };
                let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode());
                if self.endpoint.post_send(now, qpn, wr).is_err() {
                    self.refused(qpn, wr_id, opcode);
                }
            }
        }
    }

    fn refused(&self, qpn: Qpn, wr_id: u64, opcode: WcOpcode) {
        let wc = WorkCompletion::new(wr_id, WcStatus::LocQpOpErr, opcode, qpn);
        if let Some(cq) = self.endpoint.qp_cqs(qpn).and_then(|(send, recv)| {
            self.cqs
                .get(if opcode == WcOpcode::Recv { recv } else { send }.0 as usize)
                .and_then(Option::as_ref)
        }) {
            let _ = cq.try_send(wc);
        }
    }

    /// Sends up to a budget of packets; true if more are waiting.
    fn transmit(&mut self) -> io::Result<bool> {
        for _ in 0..TRANSMIT_BUDGET {
            let Some(mut transmit) = self.endpoint.poll_transmit() else {
                break;
            };
            self.backend.send(transmit.dst, &mut transmit.packet)?;
            self.endpoint.recycle(transmit.packet);
        }
        // A batching backend may hold packets back until here.
        self.backend.flush()?;
        Ok(self.endpoint.has_transmits())
    }

    /// Hands completions and events to the application, as far as its channels have room.
    fn completions(&mut self) {
        for (index, tx) in self.cqs.iter().enumerate() {
            let Some(tx) = tx else { continue };
            let cq = CqId(index as u32);
            while !tx.is_full() {
                let Some(wc) = self.endpoint.poll_cq(cq) else {
                    break;
                };
                if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = tx.try_send(wc)
                {
                    break;
                }
            }
        }
        while let Some(event) = self.endpoint.poll_event() {
            let _ = self.events.try_send(event);
        }
    }

    /// Clean shutdown: every QP is flushed, the completions delivered, the socket closed when
    /// the backend drops.
    fn shut_down(&mut self) {
        let now = self.now();
        let qpns: Vec<Qpn> = self.qps.keys().copied().collect();
        for qpn in qpns {
            let _ = self.endpoint.destroy_qp(now, qpn);
        }
        self.completions();
    }
}
