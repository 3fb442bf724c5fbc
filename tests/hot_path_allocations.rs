//! The hot path allocates nothing: once two devices have carried a few thousand messages, a
//! 64-byte RDMA WRITE, SEND (inline or not) or READ (posted, built, sent, received, landed or
//! answered, acknowledged, completed and polled) makes no heap allocation on either side.
//!
//! Both devices run with inline progress, so that every turn of both engines runs in the
//! test's thread, inside its verbs calls; the allocator counts that thread's allocations only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use softroce::prelude::*;
use softroce::verbs::Progress;

/// The system allocator, counting the allocations of threads that ask it to.
struct Counting;

thread_local! {
    /// `Some(n)`: this thread counts, and has made `n` allocations since it began to.
    static COUNTED: Cell<Option<usize>> = const { Cell::new(None) };
}

fn count_one() {
    // `try_with`: a thread's allocations while its thread-locals are torn down count nothing.
    let _ = COUNTED.try_with(|counted| {
        if let Some(n) = counted.get() {
            counted.set(Some(n + 1));
        }
    });
}

// SAFETY: every call is forwarded to `System` unchanged; counting touches a `const`
// thread-local `Cell`, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// How many allocations this thread makes in `work`.
fn allocations_in(work: impl FnOnce()) -> usize {
    COUNTED.with(|counted| counted.set(Some(0)));
    work();
    COUNTED.with(|counted| counted.replace(None)).unwrap_or(0)
}

struct End {
    _device: Device,
    cq: CompletionQueue,
    mr: MemoryRegion,
    qp: QueuePair,
    /// The SRQ the QP takes its receives from, if it has one.
    srq: Option<SharedReceiveQueue>,
}

impl End {
    /// Posts a 64-byte receive to the QP's SRQ, or to its own queue.
    fn post_recv(&self, wr_id: u64) {
        let wr = RecvWr::new(wr_id, self.mr.sge(0, 64).unwrap());
        match &self.srq {
            Some(srq) => srq.post_recv(wr),
            None => self.qp.post_recv(wr),
        }
        .unwrap();
    }
}

/// An end on host `host`, its QP on an SRQ of its own if `shared`.
fn end(host: u8, shared: bool) -> End {
    let device = Device::open(DeviceConfig {
        progress: Progress::Inline,
        ..DeviceConfig::udp([127, 0, 9, host].into())
    })
    .unwrap();
    let pd = device.alloc_pd().unwrap();
    let cq = device.create_cq(64).unwrap();
    let mr = pd
        .register(
            1 << 16,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let srq = shared.then(|| pd.create_srq(64, 0).unwrap());
    let mut qp = pd.create_qp().send_cq(&cq).recv_cq(&cq);
    if let Some(srq) = &srq {
        qp = qp.srq(srq);
    }
    End {
        _device: device,
        cq,
        mr,
        qp: qp.build().unwrap(),
        srq,
    }
}

/// Two ends, on hosts `a` and `b`, connected to each other; `b` receives through an SRQ if
/// `shared`.
fn connected(a: u8, b: u8, shared: bool) -> (End, End) {
    let (a, b) = (end(a, false), end(b, shared));
    // An ACK timeout of about 4 s (4.096 µs x 2^20), not the default's 67 ms: a host too busy
    // to run the test's thread for that long would retransmit, a path the warm-up may not
    // have grown the queues of.
    let options = ConnectOptions {
        timeout: 20,
        ..ConnectOptions::default()
    };
    a.qp.connect(&b.qp.endpoint(), &options).unwrap();
    b.qp.connect(&a.qp.endpoint(), &options).unwrap();
    (a, b)
}

/// Posts `wr` (of ID `wr_id`) from `a` to `b`, and turns both engines (by polling their
/// CQs) until it completes, and at `b`, if it is a SEND, until its receive does.
fn carry(a: &End, b: &End, wr_id: u64, wr: SendWr) {
    let is_send = matches!(wr.op, SendOp::Send);
    if is_send {
        b.post_recv(wr_id);
    }
    a.qp.post_send(wr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut sent, mut received) = (false, !is_send);
    while !(sent && received) {
        // The responder's turn takes the request and answers; the requester's takes that.
        b.cq.poll_each(1, |wc| {
            assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
            received = true;
        })
        .unwrap();
        a.cq.poll_each(1, |wc| {
            assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
            sent = true;
        })
        .unwrap();
        assert!(
            Instant::now() < deadline,
            "request {wr_id} did not complete"
        );
    }
}

/// 64-byte WRITEs, SENDs, READs and inline SENDs (`IBV_SEND_INLINE`), round after round,
/// from `a` to `b`.
fn rounds(a: &End, b: &End, ids: std::ops::Range<u64>) {
    for wr_id in ids {
        let sge = a.mr.sge(0, 64).unwrap();
        let wr = match wr_id % 4 {
            0 => SendWr::write(wr_id, sge, b.mr.remote()),
            1 => SendWr::send(wr_id, sge),
            2 => SendWr::read(wr_id, sge, b.mr.remote()),
            _ => SendWr::send_inline(wr_id, &[0x5a; 64]),
        };
        carry(a, b, wr_id, wr);
    }
}

#[test]
fn small_writes_sends_reads_and_inline_sends_allocate_nothing_once_warm() {
    // The counting counts: else a zero below would prove nothing.
    assert_eq!(
        allocations_in(|| drop(std::hint::black_box(Box::new(7u8)))),
        1
    );
    let (a, b) = connected(20, 21, false);
    // Warm: every vector at the capacity the traffic needs, every pool filled.
    rounds(&a, &b, 0..8_000);
    let allocations = allocations_in(|| rounds(&a, &b, 8_000..40_000));
    assert_eq!(allocations, 0, "allocations in 32,000 requests");
}

/// 64-byte WRITEs and SENDs in turn from `a` to `b`, each posted on its own with up to 32 in
/// flight, each SEND's receive posted on its own just before it: with inline progress each
/// post's turn takes a batch of one request into the send queue (and moves a receive into the
/// receive queue's tail), so that dozens of batches are in flight at once and one ACK retires
/// many of them.
fn stream(a: &End, b: &End, ids: std::ops::Range<u64>) {
    let (mut posted, mut done, mut received) = (ids.start, ids.start, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while done < ids.end {
        while posted < ids.end && posted - done < 32 {
            let sge = a.mr.sge(0, 64).unwrap();
            let wr = if posted % 2 == 0 {
                SendWr::write(posted, sge, b.mr.remote())
            } else {
                b.post_recv(posted);
                SendWr::send(posted, sge)
            };
            a.qp.post_send(wr).unwrap();
            posted += 1;
        }
        b.cq.poll_each(32, |wc| {
            assert_eq!(
                (wc.wr_id, wc.status),
                (ids.start + 2 * received + 1, WcStatus::Success)
            );
            received += 1;
        })
        .unwrap();
        a.cq.poll_each(32, |wc| {
            assert_eq!((wc.wr_id, wc.status), (done, WcStatus::Success));
            done += 1;
        })
        .unwrap();
        assert!(Instant::now() < deadline, "the stream stalled at {done}");
    }
    while received < (ids.end - ids.start) / 2 {
        b.cq.poll_each(32, |_| received += 1).unwrap();
        assert!(Instant::now() < deadline, "receives stalled at {received}");
    }
}

/// Requests posted one at a time, many in flight: the batches the send and receive queues hold
/// the requests in are emptied as their heads pass them and serve the next posts, so once warm
/// the stream allocates nothing (issue 24: no allocation per request).
#[test]
fn a_stream_of_single_posts_with_many_in_flight_allocates_nothing_once_warm() {
    let (a, b) = connected(22, 23, false);
    stream(&a, &b, 0..8_000);
    let allocations = allocations_in(|| stream(&a, &b, 8_000..40_000));
    assert_eq!(allocations, 0, "allocations in 32,000 requests");
}

/// The same stream with the receives posted one at a time to an SRQ: the SRQ moves each
/// post's request into its tail (a vector mostly room is not kept as a batch), frees the
/// batches QPs take requests from, and fills them again, so it too allocates nothing once
/// warm.
#[test]
fn a_stream_of_single_posts_to_an_srq_allocates_nothing_once_warm() {
    let (a, b) = connected(24, 25, true);
    stream(&a, &b, 0..8_000);
    let allocations = allocations_in(|| stream(&a, &b, 8_000..40_000));
    assert_eq!(allocations, 0, "allocations in 32,000 requests");
}
