//! Memory registration through the C library as middleware uses it (issue 50): `ibv_rereg_mr`,
//! and regions, re-registrations and windows by the hundred thousand.

mod common;

use common::run_c_expecting;

/// `ibv_rereg_mr` as verbs.h and rdma-core define it: the input rdma-core refuses before the
/// kernel (`IBV_REREG_MR_ERR_INPUT`, EINVAL) and what the kernel refuses (`_ERR_CMD`: no flag,
/// another context's PD), a new range, new rights and a new PD that the
/// peer's accesses then meet through the new keys, and the failures that leave the region as it
/// was (`IBV_REREG_MR_ERR_CMD`): memory the kernel would not pin (EFAULT), windows bound over
/// the region (EBUSY). The first keys are refused after.
#[test]
fn rereg_changes_range_rights_and_pd_or_nothing() {
    run_c_expecting(
        "rereg",
        include_str!("c/rereg.c"),
        &["-libverbs"],
        "127.0.50.1,127.0.50.2",
        &[],
        &[
            "unknown flag: 1",
            "access without its flag: 1",
            "no length: 1",
            "another device's PD: 1",
            "no change asked: 1",
            "read-only range: 1",
            "old region still written: 1",
            "new range: 1",
            "new rights: 1",
            "another PD: 1",
            "back: 1",
            "under a window: 1",
            "first rkey refused: 1",
            "deregistered: 1",
            "done",
        ],
    );
}

/// 100,000 regions registered, each registered again elsewhere (half with new rights), and
/// deregistered, twice over, then 100,000 windows: every call succeeds and every key alive is
/// unique. Before the keys were drawn per table, `ibv_reg_mr` failed with ENOMEM after as few
/// as 31 regions (Open MPI's window of sixteen 1 MiB sends aborted on it).
#[test]
fn a_hundred_thousand_regions_and_windows_register_and_go() {
    run_c_expecting(
        "many_regions",
        include_str!("c/many_regions.c"),
        &["-libverbs"],
        "127.0.50.3",
        &["100000"],
        &[
            "round 1 registered 100000, keys distinct: 1",
            "round 1 reregistered 100000, keys distinct: 1",
            "round 1 deregistered 100000",
            "round 2 registered 100000, keys distinct: 1",
            "round 2 reregistered 100000, keys distinct: 1",
            "round 2 deregistered 100000",
            "windows 100000, rkeys distinct: 1",
            "windows deallocated 100000",
            "pd deallocated: 1",
            "done",
        ],
    );
}
