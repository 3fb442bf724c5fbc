//! libibverbs 1.0's ABI (issue 50, item 2): a program of 1.0's time (`c/verbs_1_0.c`, its
//! objects in `c/verbs_1_0.h`) binds every verb at `IBVERBS_1.0`, as a binary linked against
//! libibverbs 1.0 does, and runs RC, SRQ and UD traffic, completion channels and asynchronous
//! events through 1.0's objects and 1.0's inline verbs. Before, none of the 33 was defined,
//! and such a program did not start.

mod common;

use common::run_c_expecting;

#[test]
fn a_program_of_libibverbs_1_0_runs_on_its_own_abi() {
    let source = format!(
        "{}\n{}",
        include_str!("c/verbs_1_0.h"),
        include_str!("c/verbs_1_0.c")
    );
    run_c_expecting(
        "verbs_1_0",
        &source,
        &["-libverbs"],
        "127.0.50.15,127.0.50.16",
        &[],
        &[
            "devices: 2, named: 1, guid: 1",
            "device after the list is freed: 1",
            "queries: 1 1 1",
            "state follows: 1",
            "query names 1.0 objects: 1",
            "1.0's attributes, in bounds: 1 1",
            "write: 1 1",
            "the 1.0 channel's descriptor polls: 1",
            "event names the 1.0 CQ: 1",
            "send: 1 1",
            "bad request: 1 1",
            "a lone bad request: 1 1",
            "bad receive: 1 1",
            "the one before it completed: 1",
            "srq: 1",
            "ud: 1 1",
            "limit event names the 1.0 SRQ: 1",
            "async event names the 1.0 QP: 1",
            "no multicast: 1 1",
            "no resize: 1",
            "null refused: 1 1",
            "done",
        ],
    );
}
