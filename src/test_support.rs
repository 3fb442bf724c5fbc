//! What several modules' unit tests share.

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// Pins the calling thread, and the threads it starts from then on, to the first of the CPUs
/// it may run on, so that `std::thread::available_parallelism` says 1 there. The test harness
/// runs each test on a thread of its own, so no other test is pinned.
pub(crate) fn pin_to_one_cpu() {
    let allowed = sched_getaffinity(None).unwrap();
    let mut one = CpuSet::new();
    one.set(
        (0..CpuSet::MAX_CPU)
            .find(|&cpu| allowed.is_set(cpu))
            .unwrap(),
    );
    sched_setaffinity(None, &one).unwrap();
}
