//! The engine: what drives the sans-IO core of a device from a [`Backend`] and the clock. With
//! the io layer, it is the only code that makes syscalls or reads the clock.
//!
//! It runs in one of three ways ([`Progress`]): on a thread of its own, inline, a turn at a
//! time, in the application's verbs calls, or both, handed back and forth (`drive`). The first
//! keeps the protocol going whatever the application does; the second saves the two thread
//! hand-offs of every message (application to engine, engine to application), which dominate
//! small-message latency; the third saves them while the application keeps calling.
//!
//! The application talks to it through crossbeam channels for commands (create, modify,
//! register), each with a one-shot reply channel, and wakes it with a mio [`Waker`]. Posted work
//! requests and completions do not go through channels (`queues`): a QP's posts land in a
//! queue the engine takes whole at its next turn, and a CQ's completions in the engine's ring
//! of the CQ, which the application polls or waits on. Every queue is bounded: posts by the
//! QP's depths (its slots, taken before a post), the core's queues by the sizes the
//! application chose, each ring of a CQ by its capacity; a completion that finds its ring full
//! waits in the core's completion queue, whose overflow raises a CQ overrun event.

mod cm;
mod drive;
mod lanes;
mod notify;
mod queues;
mod waiter;

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError};
use mio::{Events, Interest, Poll, Token, Waker};
use rustc_hash::FxHashMap;

pub(crate) use cm::{CmCommand, ConnEvent, ConnSender, ConnectCall};
pub use drive::Progress;
pub(crate) use drive::Watch;
pub(crate) use drive::{Driven, HANDBACK};
use drive::{Driver, Found, Runner, Turn};
use lanes::Lanes;
pub(crate) use lanes::{prepare as prepare_lanes, LaneStart};
pub(crate) use notify::CqNotify;
pub(crate) use queues::{
    CompletionRing, Completions, OnDoorbell, PostQueue, PostedTo, QpQueues, SrqQueues,
};
use queues::{QpPosts, SrqPosts};
pub use waiter::hold_signals_off_for_good;

use crate::io::{Backend, IoCounters};
use crate::memory::{Access, ForeignMemory, MemoryError, MemoryRegion, MwType, PdId};
use crate::transport::{
    AddressHandle, AddressVector, AsyncEvent, CongestionConfig, CongestionStatus, Counters, CqId,
    Endpoint, EndpointConfig, Lane, PathMtu, QpAttr, QpInit, QpState, QpType, QueueSlots,
    Resources, SrqAttr, SrqId, SrqModify, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};
use crate::wire::{LKey, Qpn, RKey};

const SOCKET: Token = Token(0);
const WAKE: Token = Token(1);
/// Datagrams handled per turn of the loop before the engine transmits what they caused.
const RECEIVE_BUDGET: usize = 64;
/// Packets sent per turn of the loop, so that a long READ response does not keep the engine
/// from receiving.
const TRANSMIT_BUDGET: usize = 256;
/// How many of the application's turns that take no posts an ACK may be held back for
/// ([`Endpoint::hold_acks`](crate::transport::Endpoint::hold_acks)): it goes out at the next
/// turn that takes the application's posts, or the engine thread's, or this many turns
/// later. Two, for a program that polls two CQs before it answers (perftest polls its send
/// CQ, then its receive CQ). With holds of one turn, the second poll released the ACK ahead
/// of the answer.
const HOLD_ACKS_TURNS: u8 = 2;
/// How long a hybrid thread beside an active application holds ACKs back
/// ([`Runner::Aside`]): its sleep on the socket ends then (rounded up to epoll's millisecond),
/// and so does its wait between looks, and they go alone. Longer than such an application
/// takes to answer a WRITE it sees land (tens of µs natively, about a hundred in the lab's
/// emulated guests), and below the retransmission timeouts programs ask for (4 µs x
/// 2^timeout; perftest asks for 2^14, 67 ms): a requester that asks for 2^8 (1 ms) or less
/// could retry a WRITE whose ACK waited here.
const HOLD_ACKS_FOR: Duration = Duration::from_micros(500);
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
    RegBuffer {
        pd: PdId,
        buffer: Vec<u8>,
        access: Access,
        reply: Reply<Result<MemoryRegion, (Vec<u8>, MemoryError)>>,
    },
    /// A program's memory, registered in place at the iova it chose.
    RegForeign {
        pd: PdId,
        memory: ForeignMemory,
        iova: u64,
        access: Access,
        reply: Reply<Result<MemoryRegion, MemoryError>>,
    },
    DeregMr(LKey, Reply<Result<(), MemoryError>>),
    /// The application dropped its last handle to the region with these keys.
    ReleaseMr(LKey, RKey),
    AllocMw(PdId, MwType, Reply<Result<RKey, MemoryError>>),
    DeallocMw(RKey, Reply<Result<(), MemoryError>>),
    /// A CQ whose completions go to this engine's ring of the application's CQ, which the
    /// CQs of the device's other engines deliver to by rings of their own.
    CreateCq {
        capacity: usize,
        completions: CompletionRing,
        notify: Arc<CqNotify>,
        reply: Reply<CqId>,
    },
    CreateQp {
        init: QpInit,
        srq: Option<SrqId>,
        reply: Reply<Result<(Qpn, QpQueues), VerbsError>>,
    },
    /// An address handle; on the device's other engines, at the number the first gave it.
    CreateAh {
        pd: PdId,
        av: AddressVector,
        at: Option<AddressHandle>,
        reply: Reply<Result<AddressHandle, VerbsError>>,
    },
    CreateSrq(PdId, SrqAttr, Reply<Result<SrqQueues, VerbsError>>),
    ModifySrq(SrqId, SrqModify, Reply<Result<(), VerbsError>>),
    ModifyQp(Qpn, Box<QpAttr>, Reply<Result<(), VerbsError>>),
    DestroyQp(Qpn, Reply<Result<(), VerbsError>>),
    DestroyCq(CqId, Reply<Result<(), VerbsError>>),
    DestroyAh(AddressHandle, Reply<Result<(), VerbsError>>),
    Stats(Reply<(Counters, IoCounters)>),
    Resources(Reply<Resources>),
    QpReceived(Qpn, Reply<Option<u64>>),
    /// The QPs congestion control has touched ([`Endpoint::congested`]).
    Congestion(Reply<Vec<(Qpn, CongestionStatus)>>),
    /// A QP's type and state, if it exists (for the CM, on another engine).
    QpInfo(Qpn, Reply<Option<(QpType, QpState)>>),
    QueryQp(Qpn, Reply<Option<QpAttr>>),
    /// Connection management ([`CmCommand`]).
    Cm(CmCommand),
    /// The QP's failure goes to the connection the CM made with it, as well as to the
    /// device's events: a QP of this engine, where the CM may run on another.
    WatchQp(Qpn, ConnSender),
    /// [`Endpoint::set_keepalive`].
    Keepalive(Qpn, Option<Duration>, Reply<Result<(), VerbsError>>),
    /// Answered once every packet queued so far (the CM's included) is in the backend's
    /// hands: after the turn whose transmit left nothing waiting.
    Flush(Reply<()>),
    Shutdown,
    /// Stops the engine as if its socket had failed with this error ([`Device::fail`]).
    ///
    /// [`Device::fail`]: crate::verbs::Device::fail
    Fail(io::Error),
}

/// How posting wakes an engine thread only when it sleeps: waking costs a syscall (an eventfd
/// write) and the thread a trip through the scheduler, and an engine that is running takes
/// every posted request at its next turn anyway.
///
/// A poster sets `posted` (or finds it set by a poster before it, which did what follows), then
/// wakes the engine if `asleep` is set; the engine sets `asleep`, then looks at `posted` before
/// it sleeps. Both are sequentially consistent, so one of the two sees the other's store:
/// either the engine does not sleep, or a poster wakes it. Each flag is read before it is
/// written (`EngineHandle::ring`), so that posts to a busy engine write none.
///
/// A QP posted to is put on `ready` once until the engine takes it off, so that a turn looks
/// only at the QPs posted to, not at every QP of the device: the poster sets the QP's `listed`
/// flag and pushes its number if the flag was clear; the engine clears the flag before it
/// takes the QP's posting queues, so a request posted after the take lists the QP again.
/// `ready` is a vector under a lock, not a channel: it keeps its capacity (as many QPs as
/// were ever posted to between two turns), where an unbounded channel allocated a block every
/// 31 numbers sent through it.
#[derive(Debug)]
struct Doorbell {
    posted: AtomicBool,
    asleep: AtomicBool,
    ready: Mutex<Vec<PostedTo>>,
}

impl Doorbell {
    fn new() -> Doorbell {
        Doorbell {
            posted: AtomicBool::new(false),
            asleep: AtomicBool::new(false),
            ready: Mutex::new(Vec::new()),
        }
    }

    /// Puts a QP or SRQ on the list of those posted to.
    fn list(&self, posted: PostedTo) {
        self.ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(posted);
    }

    /// Moves the QPs and SRQs posted to onto the end of `look_at`.
    fn take_listed(&self, look_at: &mut Vec<PostedTo>) {
        look_at.append(&mut self.ready.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// An engine thread's names: Rust's, in full ("softroce 10.99.0.11", and the engine's index
/// on a device of several), which panic messages show, and the kernel's, which `top -H`,
/// `ps -L`, `perf` and gdb show and which holds 15 bytes: there the full name would keep
/// "softroce 10.99." of every engine of every device alike. The kernel's is "sr", the engine's
/// index if the device has several, and as many whole groups of the address as fit, from its
/// end, where addresses differ: "sr 127.0.0.1", "sr1 10.99.0.11", "sr0 168.100.200".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ThreadName {
    pub full: String,
    pub kernel: String,
}

/// The bytes of a thread's name the kernel keeps (TASK_COMM_LEN, less its NUL).
const KERNEL_NAME_LEN: usize = 15;

impl ThreadName {
    fn of(local_addr: IpAddr, lane: Lane) -> ThreadName {
        let (full, prefix) = match lane.count() {
            1 => (format!("softroce {local_addr}"), "sr ".to_string()),
            _ => (
                format!("softroce {local_addr} {}", lane.index()),
                format!("sr{} ", lane.index()),
            ),
        };
        let address = local_addr.to_string();
        // An address's text is ASCII, so any byte is a boundary. A group cut in two would read
        // as another address ("0.99.100.11" of 10.99.100.11): only whole groups are kept.
        let cut = address
            .len()
            .saturating_sub(KERNEL_NAME_LEN.saturating_sub(prefix.len()));
        let whole_groups = match cut.checked_sub(1).map(|before| address.as_bytes()[before]) {
            None | Some(b'.' | b':') => cut,
            Some(_) => address[cut..]
                .find(['.', ':'])
                .map_or(address.len(), |at| cut + at + 1),
        };
        let tail = match whole_groups {
            0 => &address[..],
            // A "::" the cut fell inside leaves a separator in front.
            _ => address[whole_groups..].trim_start_matches(['.', ':']),
        };
        let kernel = prefix + tail;
        ThreadName { full, kernel }
    }
}

/// Why an engine stopped on its own: the socket's error, once set.
type Failure = Arc<OnceLock<Arc<io::Error>>>;

/// The application's side of a running engine.
pub(crate) struct EngineHandle {
    pub commands: Sender<Command>,
    pub events: Receiver<AsyncEvent>,
    /// Interrupts the engine's wait for the socket: the thread's, or an inline turn another
    /// application thread is blocked in.
    waker: Arc<Waker>,
    doorbell: Arc<Doorbell>,
    driver: Driver,
    failure: Failure,
    /// The engine has let go of everything ([`Engine::let_go`]): it touches no memory of the
    /// application's any more.
    halted: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Whether the engine has stopped, for good, and let go of the application's queues and
    /// memory: whatever it still holds (packets queued, unbuilt) it will never build.
    pub fn halted(&self) -> bool {
        self.halted.load(SeqCst)
    }

    /// The engine has stopped: why, if it stopped on its own.
    pub fn gone(&self) -> EngineGone {
        EngineGone(self.failure.get().cloned())
    }

    /// Sends a command and has the engine run it.
    pub fn command(&self, command: Command) -> Result<(), EngineGone> {
        self.commands.send(command).map_err(|_| self.gone())?;
        self.wake()
    }

    /// [`command`](Self::command), but a command the engine can no longer take comes back,
    /// with why: for commands that carry something of the application's.
    pub fn offer(&self, command: Command) -> Result<(), (Option<Command>, EngineGone)> {
        if let Err(unsent) = self.commands.send(command) {
            return Err((Some(unsent.0), self.gone()));
        }
        self.wake().map_err(|gone| (None, gone))
    }

    /// Sends a command built around a reply channel, and waits for the reply.
    pub fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, EngineGone> {
        let (reply, answer) = bounded(1);
        self.command(make(reply))?;
        answer.recv().map_err(|_| self.gone())
    }
}

/// Where a CQ's completions go to the application, and how to tell the application it has
/// news. Dropping it lets go of the queue (the CQ was destroyed here, or the engine stopped).
struct CqChannel {
    completions: CompletionRing,
    notify: Arc<CqNotify>,
}

impl Drop for CqChannel {
    fn drop(&mut self) {
        // Before the descriptor's waiters wake, so that their poll finds the device gone.
        self.completions.let_go();
        self.notify.closed();
    }
}

/// The engine has stopped: shut down by the application (`None`), or by the error that killed
/// its socket.
#[derive(Debug, Clone)]
pub struct EngineGone(pub Option<Arc<io::Error>>);

struct Engine<B: Backend> {
    endpoint: Endpoint,
    /// The device's CM: QP1 and the connections it manages. On the first engine only.
    cm: Option<cm::CmRouter>,
    /// The device's other engines.
    lanes: Lanes,
    backend: B,
    start: Instant,
    commands: Receiver<Command>,
    qps: FxHashMap<Qpn, QpPosts>,
    /// The connections its QPs' failures go to ([`Command::WatchQp`]).
    watchers: FxHashMap<Qpn, ConnSender>,
    /// The engine's ends of its SRQs' posting queues.
    srqs: FxHashMap<SrqId, SrqPosts>,
    /// Indexed by CQ number; `None` where a CQ was destroyed.
    cqs: Vec<Option<CqChannel>>,
    /// Dropped when the engine stops, so that a thread waiting for events learns it
    /// ([`AsyncEvents::wait`](crate::verbs::AsyncEvents::wait)), whoever runs the engine.
    events: Option<Sender<AsyncEvent>>,
    /// The next address handed to a registered region: regions never overlap, so an address
    /// names one region, as it does in a process's address space.
    next_iova: u64,
    poll: Poll,
    readiness: Events,
    doorbell: Arc<Doorbell>,
    /// QPs with posted requests the core had no room for at the last look: looked at again.
    posts_left: Vec<PostedTo>,
    /// `posts`' list of the QPs and SRQs to look at, kept for its capacity.
    looking: Vec<PostedTo>,
    /// Work is waiting (datagrams not yet read, packets not yet sent): the next turn must not
    /// sleep.
    backlog: bool,
    /// The socket may hold datagrams not yet read: it was readable at the last sleep, the
    /// last receive stopped at its budget, or this turn does not sleep (and so asks the
    /// socket instead of epoll). Otherwise a turn does not ask it, since readiness is
    /// edge-triggered and the last receive read until there was nothing.
    unread: bool,
    /// What the last turn received (see [`Turn::found_work`]).
    found_work: Option<Found>,
    /// How long after the last turn that moved packets the turns poll instead of sleeping
    /// (see [`Engine::busy_polling`]).
    busy_poll: Duration,
    /// When a turn last received or sent packets; `None` before the first.
    moved_packets_at: Option<Duration>,
    /// The application's turns that the ACKs held back have waited ([`HOLD_ACKS_TURNS`]).
    held_turns: u8,
    /// When the ACKs held back were first held ([`HOLD_ACKS_FOR`]); `None` while none are.
    held_since: Option<Duration>,
    /// Shut down: an inline turn does nothing more.
    stopped: bool,
    failure: Failure,
    /// Set as the last thing [`let_go`](Self::let_go) does.
    halted: Arc<AtomicBool>,
    /// Destinations the backend could not reach, handed to the core after each flush.
    unreachable: Vec<IpAddr>,
    /// [`Command::Flush`]es waiting for a turn that sends everything queued.
    flushes: Vec<Reply<()>>,
}

/// Moves what was posted to SRQ `id` into the core: the whole posting queue, its flag cleared
/// first, so that a post after the take lists the SRQ again.
fn take_srq_posts(endpoint: &mut Endpoint, id: SrqId, posts: &mut SrqPosts) {
    posts.listed.store(false, SeqCst);
    posts.recv.take_into(&mut posts.recvs);
    endpoint.post_srq_batch(id, &mut posts.recvs);
}

/// A request the core refused after `post_send` or `post_recv` returned: it completes with
/// LOC_QP_OP_ERR, through the QP's CQ like any other completion.
fn refused(endpoint: &mut Endpoint, qpn: Qpn, wr_id: u64, opcode: WcOpcode) {
    let wc = WorkCompletion::new(wr_id, WcStatus::LocQpOpErr, opcode, qpn);
    endpoint.complete_refused(qpn, wc);
}

/// What every engine of a device is started with.
#[derive(Debug, Clone)]
pub(crate) struct EngineSettings {
    /// The device's seed, which each engine varies for its QP numbers.
    pub seed: u64,
    pub port_mtu: PathMtu,
    pub progress: Progress,
    pub cm: crate::cm::CmConfig,
    pub congestion: CongestionConfig,
    /// How long after packets moved the engine's turns poll the socket rather than sleep in
    /// it (zero: never), resolved from [`DeviceConfig::busy_poll`](crate::verbs::DeviceConfig).
    pub busy_poll: Duration,
    /// The device's membership of its address group, whose place its QP numbers and CM IDs
    /// end in; `None` for a device that has its address to itself.
    pub ledger: Option<Arc<dyn crate::transport::QpnLedger>>,
}

/// Starts the engine of a device: on a thread of its own, or for the application to drive.
pub(crate) fn start<B: Backend>(
    mut backend: B,
    parts: LaneStart,
    settings: &EngineSettings,
) -> io::Result<EngineHandle> {
    let EngineSettings {
        seed,
        port_mtu,
        progress,
        cm: cm_config,
        congestion,
        busy_poll,
        ledger: _,
    } = *settings;
    let LaneStart {
        lane,
        memory,
        poll,
        waker,
        commands: (commands, command_rx),
        lanes,
        failure,
    } = parts;
    let doorbell = Arc::new(Doorbell::new());
    poll.registry()
        .register(backend.source(), SOCKET, Interest::READABLE)?;
    let (event_tx, events) = bounded(EVENT_QUEUE);
    let local_addr = backend.local_addr();
    // Each engine draws its own QP numbers; the memory keys come from the one shared table.
    let config = EndpointConfig {
        local_addr,
        seed: seed ^ u64::from(lane.index()).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        lane,
        congestion,
    };
    let mut endpoint = Endpoint::with_memory(config, memory);
    endpoint.set_port_mtu(port_mtu);
    if let Some(ledger) = &settings.ledger {
        endpoint.share_address(ledger.clone());
    }
    // The CM's receive buffers take the first addresses; the application's regions follow.
    let first_iova = 0x1000_0000;
    let cm = if lane.index() == 0 {
        let app_qps: Box<dyn crate::cm::AppQps> = if lane.count() == 1 {
            Box::new(crate::cm::OwnQps)
        } else {
            Box::new(lanes.app_qps())
        };
        let sees_all_qps = lane.count() == 1;
        let router = cm::CmRouter::new(
            &mut endpoint,
            Duration::ZERO,
            (seed, cm_config),
            first_iova,
            (app_qps, sees_all_qps),
        );
        let mut router = router.map_err(|e| io::Error::other(format!("the device's CM: {e}")))?;
        if let Some(ledger) = &settings.ledger {
            router.end_ids_in(ledger.place());
        }
        Some(router)
    } else {
        None
    };
    let engine = Engine {
        endpoint,
        cm,
        lanes,
        backend,
        start: Instant::now(),
        commands: command_rx,
        qps: FxHashMap::default(),
        watchers: FxHashMap::default(),
        srqs: FxHashMap::default(),
        cqs: Vec::new(),
        events: Some(event_tx),
        next_iova: first_iova + cm::AGENT_REGION,
        poll,
        readiness: Events::with_capacity(64),
        doorbell: doorbell.clone(),
        posts_left: Vec::new(),
        looking: Vec::new(),
        backlog: false,
        unread: true,
        found_work: None,
        busy_poll,
        moved_packets_at: None,
        held_turns: 0,
        held_since: None,
        stopped: false,
        failure,
        halted: Arc::new(AtomicBool::new(false)),
        unreachable: Vec::new(),
        flushes: Vec::new(),
    };
    let (failure, halted) = (engine.failure.clone(), engine.halted.clone());
    let name = ThreadName::of(local_addr, lane);
    let driver = Driver::start(engine, progress, name, &doorbell, Engine::run)?;
    Ok(EngineHandle {
        commands,
        events,
        waker,
        doorbell,
        driver,
        failure,
        halted,
    })
}

impl<B: Backend> Turn for Engine<B> {
    fn turn(&mut self, wait: Option<Duration>, by: Runner) -> bool {
        !self.stopped && self.step_or_stop(wait, by)
    }

    fn found_work(&self) -> Option<Found> {
        self.found_work
    }

    fn held_acks_due(&self) -> Option<Instant> {
        self.held_until().map(|until| self.start + until)
    }

    fn abandon(&mut self) {
        let _ = self.failure.set(Arc::new(io::Error::other(EnginePanicked)));
        self.lanes.halt_all();
        self.stopped = true;
        self.let_go();
    }
}

impl<B: Backend> Engine<B> {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// When the ACKs held back go at the latest ([`HOLD_ACKS_FOR`] after the first was held),
    /// on the engine's clock; `None` while none are.
    fn held_until(&self) -> Option<Duration> {
        self.held_since.map(|since| since + HOLD_ACKS_FOR)
    }

    fn run(mut self) {
        while drive::guarded_turn(&mut self, None, Runner::Thread) {}
    }

    /// A turn; false once the engine has stopped. A dead socket stops it here: every QP is
    /// flushed, the completions delivered, and the error kept for the application's calls.
    fn step_or_stop(&mut self, cap: Option<Duration>, by: Runner) -> bool {
        match self.step(cap, by) {
            Ok(running) => running,
            Err(error) => {
                tracing::error!(%error, address = %self.backend.local_addr(),
                                "the device's socket failed; the device stops");
                let _ = self.failure.set(Arc::new(error));
                self.lanes.halt_all();
                self.shut_down();
                self.stopped = true;
                false
            }
        }
    }

    /// One turn: waits for the socket up to `cap` (`None`: no cap), less if a timer is due
    /// sooner, not at all if work is waiting or while it busy polls ([`Engine::busy_polling`]);
    /// then runs the commands, takes the posted work requests, receives, fires the timers,
    /// transmits and hands out completions. False once the engine has shut down. Run `by` the
    /// application, or by the hybrid thread beside it, and taking no posts, it holds its ACKs
    /// back if they are all it has to send ([`Runner::Application`], [`Runner::Aside`]); run
    /// by anyone else, it sends what earlier turns held before it sleeps.
    fn step(&mut self, cap: Option<Duration>, by: Runner) -> io::Result<bool> {
        // A turn that may not sleep (a poll's) reads no deadline: the timers run below either
        // way, and the reading is a turn's fixed cost.
        // A turn that holds nothing sends what earlier turns held (the application's, or the
        // thread's looks) at once, rather than after its sleep.
        let sends_held =
            matches!(by, Runner::Thread | Runner::Inline) && self.endpoint.holds_acks();
        let timeout =
            if self.backlog || sends_held || cap == Some(Duration::ZERO) || self.busy_polling() {
                Some(Duration::ZERO)
            } else {
                let cm = self.cm.as_ref().and_then(cm::CmRouter::next_deadline);
                // ACKs held back go alone once they have waited their longest.
                let next = [self.endpoint.next_deadline(), cm, self.held_until()];
                let deadline = next
                    .into_iter()
                    .flatten()
                    .min()
                    .map(|deadline| deadline.saturating_sub(self.now()));
                match (deadline, cap) {
                    (Some(d), Some(c)) => Some(d.min(c)),
                    (d, c) => d.or(c),
                }
            };
        if timeout == Some(Duration::ZERO) {
            // A turn that does not sleep asks the socket itself rather than epoll first: an
            // empty look is one system call either way, and an arrival costs a `recvmsg` and
            // the one that finds the socket empty, not an `epoll_wait` as well. On one
            // emulated CPU, where each system call is dear, that is a tenth of a ping-pong's
            // calls. The socket's readiness this leaves in epoll's list does not end the next
            // sleep: epoll asks the socket again before it reports it, and it is empty by
            // then. A wake-up of the waker meanwhile (a command, a post, a caller taking the
            // engine) does end it, at once: one turn more, and nothing missed.
            self.unread = true;
        } else {
            self.sleep(timeout)?;
        }
        // Another engine of the device stopped on its own, with the device's error: this one
        // flushes its QPs and stops too.
        if self.lanes.halted() {
            self.shut_down();
            self.stopped = true;
            return Ok(false);
        }
        if !self.commands()? {
            // What the commands before the shutdown queued (the DREQ of a connection dropped
            // just before its device) still goes out, once, as far as the socket takes it.
            let now = self.now();
            if let Some(cm) = &mut self.cm {
                cm.pump(now, &mut self.endpoint);
            }
            let _ = self.transmit(false, now);
            self.shut_down();
            self.stopped = true;
            return Ok(false);
        }
        // One reading of the clock for the whole turn: its posts, what it receives, its timers.
        let now = self.now();
        let posted = self.doorbell.posted.swap(false, SeqCst) || !self.posts_left.is_empty();
        if posted {
            self.posts(now);
        }
        let accesses = self.endpoint.counters().remote_accesses;
        let (endpoint, lanes) = (&mut self.endpoint, &mut self.lanes);
        let received = if self.unread {
            self.backend.receive(RECEIVE_BUDGET, &mut |datagram| {
                if !lanes.hand_over(&datagram) {
                    endpoint.handle_received(now, datagram);
                }
            })?
        } else {
            0
        };
        self.unread = received == RECEIVE_BUDGET;
        lanes.wake();
        let handed = lanes.receive(RECEIVE_BUDGET, &mut |datagram| {
            endpoint.handle_received(now, datagram);
        });
        // The socket may still hold datagrams (readiness is edge-triggered), other engines may
        // have handed over more, or packets may be waiting to be sent: then the next turn must
        // not sleep.
        self.backlog = received == RECEIVE_BUDGET || handed == RECEIVE_BUDGET;
        self.found_work = (received > 0 || handed > 0).then(|| Found {
            at: self.start + now,
            unseen: self.endpoint.counters().remote_accesses != accesses,
        });
        if self.endpoint.next_deadline().is_some_and(|d| d <= now) {
            self.endpoint.handle_timeout(now);
        }
        // The CM takes what QP1 received and what its timers say, before the packets go out.
        if let Some(cm) = &mut self.cm {
            cm.pump_if_due(now, &mut self.endpoint, received > 0 || handed > 0);
        }
        // The application answers what this turn hands it in its next calls: its ACKs wait for
        // the turn that takes the answer, unless this one took posts.
        // A flush waits for everything queued, held ACKs included.
        let hold = !posted
            && self.flushes.is_empty()
            && match by {
                Runner::Application => self.held_turns < HOLD_ACKS_TURNS,
                Runner::Aside => self.held_until().is_none_or(|until| now < until),
                Runner::Inline | Runner::Thread => false,
            };
        let (sent, mut more_to_send) = self.transmit(hold, now)?;
        if by == Runner::Aside {
            // What the thread holds waits for a post, whose doorbell wakes it, or for
            // HOLD_ACKS_FOR, which bounds its sleep: not a backlog that keeps it from sleeping.
            more_to_send = self.endpoint.has_unheld_transmits();
        }
        self.backlog |= more_to_send;
        if self.found_work.is_some() || sent > 0 {
            self.moved_packets_at = Some(now);
        }
        if !more_to_send {
            for flushed in self.flushes.drain(..) {
                let _ = flushed.send(());
            }
        }
        self.unreachable_peers(now);
        // Requests that found their queue full may fit now that this turn's ACKs have
        // completed others: take them now, or a turn that sleeps would leave them waiting.
        if !self.posts_left.is_empty() {
            self.posts(now);
            self.backlog |= self.endpoint.has_transmits();
        }
        if self.completions() {
            // What came with completions for a CQ the application polls (it had taken all it
            // was handed) is taken in its next call: a peer's WRITE among them (a softroce
            // peer sends its answer with the ACK its own request waits for) is not one the
            // application cannot see.
            if let Some(found) = &mut self.found_work {
                found.unseen = false;
            }
        }
        Ok(true)
    }

    /// Waits for the socket or the waker up to `timeout` (`None`: no limit), or not at all if a
    /// request was posted before the doorbell heard that the engine sleeps.
    fn sleep(&mut self, mut timeout: Option<Duration>) -> io::Result<()> {
        self.doorbell.asleep.store(true, SeqCst);
        if self.doorbell.posted.load(SeqCst) {
            timeout = Some(Duration::ZERO);
        }
        // Beside the descriptor a waiting application thread lent, if any.
        let polled = waiter::sleep(&mut self.poll, &mut self.readiness, timeout);
        self.doorbell.asleep.store(false, SeqCst);
        self.unread |= self.readiness.iter().any(|event| event.token() == SOCKET);
        match polled {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e),
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
                        self.advance_iova(len);
                    }
                    let _ = reply.send(result);
                }
                Command::RegBuffer {
                    pd,
                    buffer,
                    access,
                    reply,
                } => {
                    let (iova, len) = (self.next_iova, buffer.len());
                    let result = self.endpoint.reg_buffer(pd, iova, buffer, access);
                    if result.is_ok() {
                        self.advance_iova(len);
                    }
                    let _ = reply.send(result);
                }
                Command::RegForeign {
                    pd,
                    memory,
                    iova,
                    access,
                    reply,
                } => {
                    let _ = reply.send(self.endpoint.reg_foreign(pd, iova, memory, access));
                }
                Command::DeregMr(lkey, reply) => {
                    let _ = reply.send(self.endpoint.dereg_mr(lkey));
                }
                Command::ReleaseMr(lkey, rkey) => self.endpoint.release_mr(lkey, rkey),
                Command::AllocMw(pd, kind, reply) => {
                    let _ = reply.send(self.endpoint.alloc_mw(pd, kind));
                }
                Command::DeallocMw(rkey, reply) => {
                    let _ = reply.send(self.endpoint.dealloc_mw(rkey));
                }
                Command::CreateCq {
                    capacity,
                    completions,
                    notify,
                    reply,
                } => {
                    let cq = self.endpoint.create_cq(capacity);
                    // The core reuses a destroyed CQ's number, and so its slot here; the CM's
                    // own CQ has a number but no slot.
                    let slot = cq.0 as usize;
                    if slot >= self.cqs.len() {
                        self.cqs.resize_with(slot + 1, || None);
                    }
                    self.cqs[slot] = Some(CqChannel {
                        completions,
                        notify,
                    });
                    let _ = reply.send(cq);
                }
                Command::CreateQp { init, srq, reply } => {
                    let created = match srq {
                        Some(srq) => self.endpoint.create_qp_with_srq(init, srq),
                        None => self.endpoint.create_qp(init),
                    };
                    let result = created.map(|qpn| {
                        let slots = Arc::new(QueueSlots::default());
                        let shared = self.endpoint.share_slots(qpn, slots.clone());
                        debug_assert!(shared.is_ok(), "the QP was just created");
                        let (posts, queues) = QpPosts::open(qpn, slots);
                        self.qps.insert(qpn, posts);
                        (qpn, queues)
                    });
                    let _ = reply.send(result);
                }
                Command::CreateAh { pd, av, at, reply } => {
                    let created = match at {
                        None => self.endpoint.create_ah(pd, av),
                        Some(ah) => self.endpoint.create_ah_at(ah, pd, av).map(|()| ah),
                    };
                    let _ = reply.send(created);
                }
                Command::CreateSrq(pd, attr, reply) => {
                    let created = self.endpoint.create_srq(pd, attr).map(|id| {
                        let slots = Arc::new(QueueSlots::default());
                        let shared = self.endpoint.share_srq_slots(id, slots.clone());
                        debug_assert!(shared.is_ok(), "the SRQ was just created");
                        let (posts, queues) = SrqPosts::open(id, attr.max_wr, slots);
                        self.srqs.insert(id, posts);
                        queues
                    });
                    let _ = reply.send(created);
                }
                Command::ModifySrq(srq, change, reply) => {
                    self.take_srq_posts(srq);
                    let modified = self.endpoint.modify_srq(srq, &change);
                    // The size the posts are held to, stored here, in the order the resizes
                    // are applied, before the caller hears of it.
                    if let (Ok(()), Some(max_wr), Some(posts)) =
                        (&modified, change.max_wr, self.srqs.get(&srq))
                    {
                        posts.max_wr.store(max_wr, SeqCst);
                    }
                    let _ = reply.send(modified);
                }
                Command::ModifyQp(qpn, attr, reply) => {
                    let _ = reply.send(self.endpoint.modify_qp(now, qpn, &attr));
                }
                Command::DestroyQp(qpn, reply) => {
                    let _ = reply.send(self.destroy_qp(now, qpn));
                }
                Command::WatchQp(qpn, events) => {
                    self.watchers.insert(qpn, events);
                }
                Command::Keepalive(qpn, interval, reply) => {
                    let _ = reply.send(self.endpoint.set_keepalive(now, qpn, interval));
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
                Command::QpReceived(qpn, reply) => {
                    let _ = reply.send(self.endpoint.qp_received(qpn));
                }
                Command::Congestion(reply) => {
                    let _ = reply.send(self.endpoint.congested().collect());
                }
                Command::QueryQp(qpn, reply) => {
                    let _ = reply.send(self.endpoint.query_qp(qpn));
                }
                Command::QpInfo(qpn, reply) => {
                    let ep = &self.endpoint;
                    let _ = reply.send(ep.qp_type(qpn).zip(ep.qp_state(qpn)));
                }
                Command::Resources(reply) => {
                    let ours = self.endpoint.resources();
                    let _ = reply.send(match &self.cm {
                        Some(cm) => ours.less(&cm.resources()),
                        None => ours,
                    });
                }
                // The device sends CM commands to its first engine, the one with the CM.
                Command::Cm(command) => {
                    if let Some(cm) = &mut self.cm {
                        cm.command(now, &mut self.endpoint, command);
                    }
                }
                Command::Stats(reply) => {
                    let mut io = self.backend.counters();
                    self.lanes.count(&mut io);
                    let _ = reply.send((self.endpoint.counters().clone(), io));
                }
                Command::Flush(reply) => self.flushes.push(reply),
                Command::Shutdown => return Ok(false),
                Command::Fail(error) => return Err(error),
            }
        }
    }

    /// Moves posted work requests into the core, as far as its queues have room (the QP's
    /// slots keep posts within its depths, so they all fit unless the core still holds
    /// requests a modify will flush). A request the core refuses completes with
    /// LOC_QP_OP_ERR, since `post_send` has already returned. An SRQ's are all taken: its
    /// posts counted them against its depth. `now` is the turn's time.
    fn posts(&mut self, now: Duration) {
        // Both lists keep their capacity from turn to turn: no allocation here.
        let mut look_at = std::mem::take(&mut self.looking);
        look_at.clear();
        look_at.append(&mut self.posts_left);
        self.doorbell.take_listed(&mut look_at);
        let endpoint = &mut self.endpoint;
        for &listed in &look_at {
            let qpn = match listed {
                PostedTo::Qp(qpn) => qpn,
                PostedTo::Srq(id) => {
                    if let Some(posts) = self.srqs.get_mut(&id) {
                        take_srq_posts(endpoint, id, posts);
                    }
                    continue;
                }
            };
            // Gone: destroyed after it was posted to.
            let Some(posts) = self.qps.get_mut(&qpn) else {
                continue;
            };
            // Before the take: a post after it lists the QP again.
            posts.listed.store(false, SeqCst);
            posts.recv.take_into(&mut posts.recvs);
            let room = endpoint.recv_queue_room(qpn).min(posts.recvs.len());
            // Taken in one call when the QP takes them all (the usual case: as they lie, or a
            // single post into the queue's tail), else one at a time.
            if !endpoint.take_recv_batch(qpn, &mut posts.recvs, room) {
                for wr in posts.recvs.drain(..room) {
                    let wr_id = wr.wr_id;
                    if endpoint.post_recv(qpn, wr).is_err() {
                        refused(endpoint, qpn, wr_id, WcOpcode::Recv);
                    }
                }
            }
            // One batch: queued first, then sent as one run; a request refused completes
            // with LOC_QP_OP_ERR in its place.
            posts.send.take_into(&mut posts.sends);
            let room = endpoint.send_queue_room(qpn).min(posts.sends.len());
            endpoint.post_checked_send_batch(now, qpn, &mut posts.sends, room);
            if !posts.sends.is_empty() || !posts.recvs.is_empty() {
                self.posts_left.push(listed);
            }
        }
        // A QP can be both left over and posted to again.
        self.posts_left.sort_unstable_by_key(|listed| listed.key());
        self.posts_left.dedup();
        self.looking = look_at;
    }

    /// Moves what was posted to SRQ `id` into the core now.
    fn take_srq_posts(&mut self, id: SrqId) {
        if let Some(posts) = self.srqs.get_mut(&id) {
            take_srq_posts(&mut self.endpoint, id, posts);
        }
    }

    /// Destroys a QP, flushing with the requests it held those still in its posting queues,
    /// which the application posted but the engine had not taken yet.
    fn destroy_qp(&mut self, now: Duration, qpn: Qpn) -> Result<(), VerbsError> {
        self.watchers.remove(&qpn);
        let unposted: Vec<WorkCompletion> = match self.qps.remove(&qpn) {
            Some(posts) => {
                let (sends, recvs) = posts.close();
                let flushed =
                    |wr_id, opcode| WorkCompletion::new(wr_id, WcStatus::WrFlushErr, opcode, qpn);
                let sends = sends
                    .into_iter()
                    .map(|wr| flushed(wr.wr_id, wr.op.wc_opcode()));
                let recvs = recvs
                    .into_iter()
                    .map(|wr| flushed(wr.wr_id, WcOpcode::Recv));
                sends.chain(recvs).collect()
            }
            None => Vec::new(),
        };
        self.endpoint.destroy_qp(now, qpn, unposted)
    }

    /// Sends what the core has queued, up to [`TRANSMIT_BUDGET`] packets: how many it sent,
    /// and whether more are queued. Asked to `hold` (at `now`), it holds the ACKs back if they
    /// are all it has to send; otherwise, or if it has other packets to send, it sends those
    /// held behind what it queued. The caller bounds the hold ([`HOLD_ACKS_TURNS`],
    /// [`HOLD_ACKS_FOR`]).
    fn transmit(&mut self, hold: bool, now: Duration) -> io::Result<(usize, bool)> {
        if hold {
            self.endpoint.hold_acks();
        } else {
            self.endpoint.release_held_acks();
        }
        if self.endpoint.holds_acks() {
            self.held_turns = self.held_turns.saturating_add(1);
            self.held_since.get_or_insert(now);
        } else {
            self.held_turns = 0;
            self.held_since = None;
        }
        let mut sent = 0;
        while sent < TRANSMIT_BUDGET {
            // Each packet is built once, where the backend sends it from.
            let room = self.backend.room()?;
            let Some((dst, len)) = self.endpoint.poll_transmit_into(room) else {
                break;
            };
            self.backend.commit(dst, len)?;
            sent += 1;
        }
        // A batching backend may hold packets back until here.
        self.backend.flush()?;
        Ok((sent, self.endpoint.has_transmits()))
    }

    /// Whether this turn polls the socket rather than sleep in it: packets moved within the
    /// last `busy_poll`. A peer that answers within it is then seen without a wake-up (the
    /// sleeping thread's, and the sender's system call that makes it), and posts need no
    /// doorbell ring, since the engine is not asleep.
    fn busy_polling(&self) -> bool {
        !self.busy_poll.is_zero()
            && self
                .moved_packets_at
                .is_some_and(|moved| self.now().saturating_sub(moved) < self.busy_poll)
    }

    /// Fails the QPs connected to destinations the backend could not reach, and hands the
    /// CM the ICMP reports the network sent back (which only an unanswered REQ heeds: they
    /// are easily forged).
    fn unreachable_peers(&mut self, now: Duration) {
        let unreachable = &mut self.unreachable;
        self.backend
            .drain_unreachable(&mut |dst| unreachable.push(dst));
        for dst in self.unreachable.drain(..) {
            self.endpoint.handle_unreachable(now, dst);
            if let Some(cm) = &mut self.cm {
                cm.handle_unreachable(now, &mut self.endpoint, dst);
            }
        }
        if let Some(cm) = &mut self.cm {
            let endpoint = &mut self.endpoint;
            self.backend.drain_refusals(&mut |dst, quoted| {
                cm.handle_refused(now, endpoint, (dst, quoted));
            });
        }
    }

    /// Moves the next region's address past one of `len` bytes: regions stay page-aligned and
    /// apart, so an address names one region.
    fn advance_iova(&mut self, len: usize) {
        self.next_iova += (len as u64).div_ceil(4096).max(1) * 4096;
    }

    /// Hands completions and events to the application, as far as its channels have room;
    /// whether it handed completions to a CQ the application had drained (one it polls).
    fn completions(&mut self) -> bool {
        let mut awaited = false;
        let endpoint = &mut self.endpoint;
        for (index, channel) in self.cqs.iter_mut().enumerate() {
            let Some(CqChannel {
                completions,
                notify,
            }) = channel
            else {
                continue;
            };
            let cq = CqId(index as u32);
            // Most turns complete nothing on most CQs: a look at the core's queue costs less
            // than one at the ring's free slots, which the polling thread moves.
            if !endpoint.has_completions(cq) {
                continue;
            }
            let mut solicited = false;
            let drained = completions.drained();
            let delivered = completions.deliver(
                || endpoint.poll_cq(cq),
                |wc| solicited |= wc.solicited || wc.status != WcStatus::Success,
            );
            if delivered > 0 {
                notify.delivered(solicited);
                awaited |= drained;
            }
        }
        while let Some(event) = self.endpoint.poll_event() {
            if let AsyncEvent::QpAccessError { qpn } | AsyncEvent::QpFatal { qpn } = event {
                // Once: the connection keeps the first, and its channel has room for what
                // the CM still has to say.
                if let Some(connection) = self.watchers.remove(&qpn) {
                    let _ = connection.try_send(ConnEvent::QpFailed(event));
                }
            }
            if let Some(events) = &self.events {
                let _ = events.try_send(event);
            }
        }
        awaited
    }

    /// Shutdown, clean or not: every QP is flushed and the completions delivered; then the
    /// engine lets go of its channels, so that the application's posts and polls, once the
    /// completions are drained, learn that the device is gone. The socket closes when the
    /// backend drops.
    fn shut_down(&mut self) {
        let now = self.now();
        let qpns: Vec<Qpn> = self.qps.keys().copied().collect();
        for qpn in qpns {
            let _ = self.destroy_qp(now, qpn);
        }
        self.completions();
        self.qps.clear();
        self.let_go();
    }

    /// Lets go of the CQs' queues and the SRQs' posting queues, and wakes their waiting tasks
    /// and threads; drops the commands queued, whose callers, and any later ones, get no
    /// answer and see the engine gone.
    fn let_go(&mut self) {
        self.cqs.clear();
        self.events = None;
        // A connection's, a listener's and a SIDR request's channels are gone once the CM's
        // engine and the QPs' let go of them: their waits learn that the device stopped.
        self.watchers.clear();
        self.cm = None;
        // Closes the SRQs' posting queues: a later post is refused, not lost (a hybrid or
        // inline engine stays in memory, stopped, for as long as the device's handles).
        self.srqs.clear();
        while self.commands.try_recv().is_ok() {}
        self.halted.store(true, SeqCst);
    }
}

/// Why a device stopped when its engine panicked: the [`io::Error`] inside
/// `Error::DeviceFailed` then wraps this. The panic's own message went to the panic hook
/// (stderr by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnginePanicked;

impl std::fmt::Display for EnginePanicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("its engine panicked, a bug in softroce (the panic message went to stderr)")
    }
}

impl std::error::Error for EnginePanicked {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel keeps 15 bytes of a thread's name (`comm`): the engine's index and the end of
    /// its address survive, whatever the address.
    #[test]
    fn an_engine_threads_kernel_name_keeps_its_engine_and_the_end_of_its_address() {
        let name = |addr: &str, index, count| {
            ThreadName::of(addr.parse().unwrap(), Lane::new(index, count).unwrap())
        };
        assert_eq!(name("10.99.0.11", 1, 2).full, "softroce 10.99.0.11 1");
        assert_eq!(name("127.0.0.1", 0, 1).full, "softroce 127.0.0.1");
        // (address, engine, engines, the kernel's name)
        let cases = [
            ("127.0.0.1", 0, 1, "sr 127.0.0.1"),
            ("10.99.0.11", 1, 2, "sr1 10.99.0.11"),
            ("192.168.100.200", 0, 2, "sr0 168.100.200"),
            // A group cut in two is left out: not "sr 0.99.100.200".
            ("10.99.100.200", 0, 1, "sr 99.100.200"),
            ("192.168.1.200", 1, 2, "sr1 168.1.200"),
            ("fd99:1:2:3::5678:9abc", 11, 16, "sr11 5678:9abc"),
            ("fd99:1:2:3::5678:9abc", 0, 1, "sr 3::5678:9abc"),
            ("fd99::1", 63, 64, "sr63 fd99::1"),
            ("::1", 0, 1, "sr ::1"),
        ];
        for (addr, index, count, kernel) in cases {
            let name = name(addr, index, count);
            assert!(name.kernel.len() <= KERNEL_NAME_LEN, "{name:?}");
            assert_eq!(name.kernel, kernel, "{addr}");
        }
    }
}
