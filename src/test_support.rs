//! What several modules' unit tests share.

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// Pins the calling thread, and the threads it starts from then on, to the first of the CPUs
/// it may run on, so that `std::thread::available_parallelism` says 1 there. The test harness
/// runs each test on a thread of its own, so no other test is pinned. Returns the CPUs it
/// was allowed before, for [`allow_cpus`].
pub(crate) fn pin_to_one_cpu() -> CpuSet {
    let allowed = sched_getaffinity(None).unwrap();
    let mut one = CpuSet::new();
    one.set(
        (0..CpuSet::MAX_CPU)
            .find(|&cpu| allowed.is_set(cpu))
            .unwrap(),
    );
    sched_setaffinity(None, &one).unwrap();
    allowed
}

/// Lets the calling thread run on `cpus` again: a helper that a pinned test starts, which
/// must not wait behind the threads under test for the one CPU.
pub(crate) fn allow_cpus(cpus: &CpuSet) {
    sched_setaffinity(None, cpus).unwrap();
}
