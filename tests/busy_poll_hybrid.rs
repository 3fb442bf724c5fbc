//! The hybrid thread's busy polling (`DeviceConfig::busy_poll`), in a test binary of its own:
//! it finds the device's engine thread as the thread that opening the device started, which
//! no other test's threads can be confused with.

use std::collections::BTreeSet;
use std::time::Duration;

use softroce::memory::Access;
use softroce::transport::{ConnectOptions, Payload, SendOp, SendWr, WcStatus};
use softroce::verbs::{Device, DeviceConfig, Progress, MAX_BUSY_POLL};

/// The process's threads.
fn threads() -> BTreeSet<u32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|entry| {
            entry
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

/// The CPU time thread `tid` has used (`schedstat`'s first field, in nanoseconds).
fn cpu_of(tid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
    let nanos = stat.split_whitespace().next().unwrap().parse().unwrap();
    Duration::from_nanos(nanos)
}

/// Once the application stops calling, the hybrid thread takes the engine over (within 1 ms,
/// `HANDBACK`), and its turns poll until `busy_poll` has passed since packets last moved, then
/// sleep. Ten rounds of an 8-byte WRITE, whose completion the application waits for, then 30 ms
/// in which it calls nothing, then 30 ms more: with the longest busy polling allowed (10 ms),
/// the thread uses about 90 ms of CPU over the first quiet spells and next to none over the
/// second.
#[test]
fn a_hybrid_engines_thread_polls_after_taking_over_then_sleeps() {
    let before = threads();
    // The address to itself: a device that shares it starts its group's keeper thread too.
    let a = Device::open(DeviceConfig {
        progress: Progress::Hybrid,
        busy_poll: Some(MAX_BUSY_POLL),
        share_address: false,
        ..DeviceConfig::udp("127.0.9.11".parse().unwrap())
    })
    .unwrap();
    let started: Vec<u32> = threads().difference(&before).copied().collect();
    let [engine_thread] = started[..] else {
        panic!("opening a hybrid device started one thread, not {started:?}");
    };
    let b = Device::open(DeviceConfig {
        progress: Progress::Thread,
        busy_poll: Some(Duration::ZERO),
        ..DeviceConfig::udp("127.0.9.12".parse().unwrap())
    })
    .unwrap();
    let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let mr_a = pd_a.register(4096, Access::LOCAL_WRITE).unwrap();
    let mr_b = pd_b
        .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let qp_a = pd_a
        .create_qp()
        .send_cq(&cq_a)
        .recv_cq(&cq_a)
        .build()
        .unwrap();
    let qp_b = pd_b
        .create_qp()
        .send_cq(&cq_b)
        .recv_cq(&cq_b)
        .build()
        .unwrap();
    let options = ConnectOptions::default();
    qp_a.connect(&qp_b.endpoint(), &options).unwrap();
    qp_b.connect(&qp_a.endpoint(), &options).unwrap();

    let quiet_spell = || {
        let before = cpu_of(engine_thread);
        std::thread::sleep(Duration::from_millis(30));
        cpu_of(engine_thread) - before
    };
    let (mut first, mut second) = (Duration::ZERO, Duration::ZERO);
    for round in 0..10 {
        let write = SendOp::Write {
            remote_addr: mr_b.iova(),
            rkey: mr_b.rkey(),
        };
        let sge = mr_a.sge(0, 8).unwrap();
        qp_a.post_send(SendWr::new(round, write, Payload::Sges([sge].into())))
            .unwrap();
        let wc = cq_a.wait(Duration::from_secs(10)).unwrap();
        assert_eq!(
            wc.expect("the WRITE's completion").status,
            WcStatus::Success
        );
        first += quiet_spell();
        second += quiet_spell();
    }
    // Floors and ceilings far from the expected figures: the other test binaries do not run
    // beside this one, but the machine may be busy.
    assert!(
        first >= Duration::from_millis(20),
        "the thread polled for 10 ms after each WRITE: {first:?} of CPU"
    );
    assert!(
        second < Duration::from_millis(15),
        "10 ms after the last packet the thread slept: {second:?} of CPU"
    );
}
