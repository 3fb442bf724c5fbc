//! The C boundary's defects of issue 49, each a C program through the library that failed
//! before its fix: what a program's ordinary use, or a peer, must not be able to do to it.
//!
//! The programs are compiled after `c/common.h`, whose two devices of one process
//! (`SOFTROCE_ADDR` names two addresses), with an RC QP on each connected to the other, give a
//! test a peer without a second process.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::{finish, program, run_c_expecting as run_expecting, succeeded, C_LIMIT as LIMIT};

/// `source`, after `c/common.h`, compiled with `libs`: the program's path.
fn compile(name: &str, source: &str, libs: &[&str]) -> String {
    let built = common::compile_c_with_common(name, source, libs);
    built.to_str().unwrap().to_string()
}

/// Runs the program at `path` on `addrs` with `args` and `SOFTROCE_PROGRESS=progress`, and
/// checks that it succeeded and printed each of `lines`.
fn run_in_progress(
    name: &str,
    path: &str,
    addrs: &str,
    args: &[&str],
    progress: &str,
    lines: &[&str],
) {
    let mut run = program(addrs, path, args);
    run.env("SOFTROCE_PROGRESS", progress);
    let output = finish(name, run.spawn().unwrap(), LIMIT);
    let out = succeeded(name, &output);
    for line in lines {
        assert!(out.contains(line), "{progress}: no {line:?} in:\n{out}");
    }
}

/// Runs `c/stress.c` built with `sanitizer` (`-fsanitize=...`) on two addresses of
/// 127.0.49.`first`, with `options` in its environment, for `SOFTROCE_STRESS_ROUNDS` rounds
/// (30, a few seconds, unless set); asserts it succeeded with its threads having done their
/// work.
fn stress(sanitizer: &str, first: u8, options: (&str, String)) {
    let flag = format!("-fsanitize={sanitizer}");
    let name = format!("stress_{sanitizer}");
    let libs = ["-lrdmacm", "-libverbs", "-lpthread", "-g", flag.as_str()];
    let path = compile(&name, include_str!("c/stress.c"), &libs);
    let rounds = std::env::var("SOFTROCE_STRESS_ROUNDS").unwrap_or_else(|_| "30".into());
    let addrs = [
        format!("127.0.49.{first}"),
        format!("127.0.49.{}", first + 1),
    ];
    let mut run = program(&addrs.join(","), &path, &[&addrs[0], &addrs[1], &rounds]);
    run.env(options.0, options.1);
    let output = finish(&name, run.spawn().unwrap(), LIMIT);
    let out = succeeded(&name, &output);
    for line in [
        "completions: 1, cq events: 1, asynchronous events: 1",
        "events: 1",
        "done",
    ] {
        assert!(out.contains(line), "{name}: no {line:?} in:\n{out}");
    }
}

/// Threads that post, poll, take and acknowledge events, and destroy QPs, CQs, SRQs and IDs,
/// all at once (`c/stress.c`), under AddressSanitizer: the program's reads of the library's
/// structures and every free are checked, so a use after free, a double free, or a destroy
/// refused for a use that has ended fails the run. (Leaks are not looked for: the library
/// keeps its devices, and librdmacm's contexts, for the process's life, as rdma-core does.)
#[test]
fn concurrent_calls_pass_address_sanitizer() {
    stress("address", 18, ("ASAN_OPTIONS", "detect_leaks=0".into()));
}

/// The stress under ThreadSanitizer, which can see only part of it: the library is not built
/// with ThreadSanitizer (that needs a nightly compiler), so its atomics and locks are invisible
/// and its own copies and allocations would read as races; they are suppressed. What is left
/// are the races the program's own accesses take part in, its inline verbs' reads of the
/// library's structures among them.
#[test]
fn concurrent_calls_pass_thread_sanitizer_on_the_programs_side() {
    let suppressions = common::own_dir().join("tsan.supp");
    std::fs::write(
        &suppressions,
        "called_from_lib:libibverbs.so.1\ncalled_from_lib:librdmacm.so.1\n",
    )
    .unwrap();
    let options = format!("suppressions={}:halt_on_error=1", suppressions.display());
    stress("thread", 20, ("TSAN_OPTIONS", options));
}

/// Defect 1: `rdma_destroy_qp` destroyed a CQ the program passed to `rdma_create_qp` (its next
/// poll read freed memory), and a PD of another context was taken.
#[test]
fn rdma_destroy_qp_leaves_the_programs_own_cq() {
    run_expecting(
        "own_cq",
        include_str!("c/own_cq.c"),
        &["-lrdmacm", "-libverbs"],
        "127.0.49.1",
        &["127.0.49.1"],
        &[
            "the id names only the cq librdmacm made: 1",
            "own cq polls after rdma_destroy_qp: 1",
            "own cq destroyed by the program: 1",
            "pd of another context: -1 EINVAL, no qp: 1",
            "done",
        ],
    );
}

/// Defect 2: `ibv_reg_mr` took memory that was not mapped, or read-only for a region that
/// grants writes, where rdma-core fails with `EFAULT`; a peer's WRITE into it then killed the
/// process.
#[test]
fn registration_refuses_what_the_kernel_would_not_pin() {
    run_expecting(
        "registration",
        include_str!("c/registration.c"),
        &["-libverbs"],
        "127.0.49.16,127.0.49.17",
        &[],
        &[
            "static, for writing: registered",
            "stack, for writing: registered",
            "read-only, for remote writes: EFAULT",
            "read-only, for local writes: EFAULT",
            "read-only, for windows: EFAULT",
            "read-only, for remote reads: registered",
            "no rights: EFAULT",
            "a page unmapped inside: EFAULT",
            "unmapped: EFAULT",
            "on demand: EOPNOTSUPP",
            "peer reads: 1, peer's write refused: 1",
            "done",
        ],
    );
}

/// Defect 2's second half: memory the program unmapped, or made read-only, after registering
/// it killed the process at a peer's access (SIGSEGV on the engine's thread). Each access now
/// fails as one no key grants, and the process lives on.
#[test]
fn memory_taken_away_after_registration_costs_the_access_not_the_process() {
    let path = compile(
        "taken_away",
        include_str!("c/taken_away.c"),
        &["-libverbs", "-lpthread"],
    );
    // Then with every signal blocked before the devices open: the engine threads inherit the
    // mask, and unblock the faults they recover from.
    for (progress, args) in [("hybrid", &[][..]), ("thread", &["block"][..])] {
        let lines = [
            "peer's write into unmapped memory: remote access error",
            "peer's read into unmapped memory: remote access error",
            "peer's atomic into unmapped memory: remote access error",
            "peer's write into memory made read-only: remote access error, memory as it was: 1",
            "send out of unmapped memory: sent, received: zeros",
            "alive",
        ];
        run_in_progress(
            "taken_away",
            &path,
            "127.0.49.22,127.0.49.23",
            args,
            progress,
            &lines,
        );
    }
}

/// Defect 3: after `fork()`, the child's `exit()` ran the library's exit handler on its
/// parent's devices, which with hybrid or inline progress took a datagram meant for the
/// parent's QP off the shared socket (and with thread progress waited a second for an engine
/// the child does not have); a call of the child's on its parent's objects did the same.
#[test]
fn a_child_after_fork_never_runs_its_parents_engine() {
    let path = compile("fork", include_str!("c/fork.c"), &["-libverbs"]);
    let mut run = program("127.0.49.8,127.0.49.9,127.0.49.10", &path, &[]);
    run.env("SOFTROCE_PROGRESS", "inline");
    let output = finish("fork", run.spawn().unwrap(), LIMIT);
    let out = succeeded("fork", &output);
    for line in [
        "child: the parent's qp refused: 1",
        "child: a device of its own works: 1",
        "child exited: 1",
        "the parent's first poll completes its receive: 1",
        "done",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}

/// Suspected, and confirmed: a QP destroyed while something else held it (its CM connection, or
/// an unacknowledged event) stayed in the engine, and took a peer's WRITEs into the program's
/// registered memory after `ibv_destroy_qp` had returned.
#[test]
fn a_destroyed_qp_takes_nothing_more_from_its_peer() {
    run_expecting(
        "destroyed_qp",
        include_str!("c/destroyed_qp.c"),
        &["-lrdmacm", "-libverbs"],
        "127.0.49.11,127.0.49.12",
        &["127.0.49.11", "127.0.49.12"],
        &[
            "write before the destroy: 1",
            "write after the destroy reaches nothing: 1",
            "done",
        ],
    );
}

/// A device that fails ends every wait on it with an error the program sees, as a device
/// rdma-core's kernel removes does: before, only `ibv_poll_cq` said so, and a thread waiting
/// for a CQ's event, an asynchronous event or a CM event waited for ever.
#[test]
fn a_failed_device_ends_every_wait_with_an_error() {
    let path = compile(
        "device_fatal",
        include_str!("c/device_fatal.c"),
        &["-lrdmacm", "-libverbs", "-lpthread"],
    );
    for progress in ["hybrid", "thread"] {
        let lines = [
            "sockets replaced: 1",
            "async wait: 0, device fatal: 1",
            "cq wait: -1, EIO: 1",
            "cm wait: 0, device removal: 1",
            "poll after the failure: -1",
            "post after the failure refused: 1, bad_wr 1",
            "a later cq wait: -1, EIO: 1",
            "dereg after the failure: 0",
            "the other device works: 1",
            "done",
        ];
        let (addrs, args) = ("127.0.49.13,127.0.49.14", &["127.0.49.13"][..]);
        run_in_progress("device_fatal", &path, addrs, args, progress, &lines);
    }
}

/// Defect 4: `rdma_listen`'s backlog was ignored, and a peer could make a listener whose
/// program does not read its events hold any number of requests (200 seen, one ID each).
#[test]
fn a_listener_holds_no_more_unread_requests_than_its_backlog() {
    use std::io::BufRead;

    let path = compile(
        "backlog",
        include_str!("c/backlog.c"),
        &["-lrdmacm", "-libverbs"],
    );
    let mut child = program("127.0.49.6,127.0.49.7", &path, &["127.0.49.6"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    // The RC count goes ahead once the library said that the REQ beyond the backlog of the
    // listener on port 7300 was let go: all five REQs were handled then.
    let said = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in stderr.lines().map_while(Result::ok) {
            if line.contains("rdma_listen on 127.0.49.6:7300") {
                let _ = stdin.write_all(b"go\n");
            }
            lines.push(line);
        }
        lines
    });
    let output = finish("backlog", child, LIMIT);
    let said = said.join().unwrap().join("\n");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}\n{out}\nstderr:\n{said}",
        output.status
    );
    for line in [
        "sidr refused beyond the backlog: 6",
        "sidr requests waiting: 4",
        "rc requests waiting: 4",
        "done",
    ] {
        assert!(
            out.contains(line),
            "no {line:?} in:\n{out}\nstderr:\n{said}"
        );
    }
    assert_eq!(
        said.matches("rdma_listen on 127.0.49.6:7300").count(),
        1,
        "said once per listener:\n{said}"
    );
}

/// Defect 5: a call that says something on standard error panicked when that failed (stderr a
/// closed pipe, SIGPIPE ignored), and outside `guard` the panic aborted the process.
#[test]
fn no_panic_crosses_into_c_when_standard_error_is_gone() {
    let path = compile(
        "stderr_closed",
        include_str!("c/stderr_closed.c"),
        &["-lrdmacm", "-libverbs", "-ldl"],
    );
    let mut child = program("127.0.49.2", &path, &[])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    // Standard error's reader goes first; then the program may start.
    drop(child.stderr.take());
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let output = finish("stderr_closed", child, LIMIT);
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}: {out}", output.status);
    for line in [
        "resize: EOPNOTSUPP",
        "attach: EOPNOTSUPP",
        "detach: EOPNOTSUPP",
        "gid index 1: -1 EINVAL",
        "join: -1 EOPNOTSUPP",
        "leave: -1 EOPNOTSUPP",
        "provider: EOPNOTSUPP",
        "alive",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
}

/// Found with qperf (issue 50): a wait for an event went on through a signal, where
/// rdma-core's `read()` returns `EINTR`, so a program that ends its last wait with an alarm
/// (qperf at the end of each test) hung until its peer gave up. A handler with `SA_RESTART`
/// lets the wait go on, as the kernel restarts the `read()`.
#[test]
fn a_signal_ends_a_wait_for_an_event() {
    run_expecting(
        "interrupted",
        include_str!("c/interrupted.c"),
        &["-lrdmacm", "-libverbs", "-lpthread"],
        "127.0.49.24",
        &[],
        &[
            "ibv_get_cq_event: -1 Interrupted system call, alarms 1",
            "ibv_get_async_event: -1 Interrupted system call, alarms 2",
            "rdma_get_cm_event: -1 Interrupted system call, alarms 3",
            "restarted: 0 RDMA_CM_EVENT_ADDR_RESOLVED, alarms 4",
            "done",
        ],
    );
}

/// A wait in `ibv_get_cq_event` runs the engine on the waiting thread, and holds the thread's
/// signals off meanwhile: a handler that calls `exit()` (whose hook flushes the devices through
/// their engines) runs once the wait has let go of the engine, and the process ends, where a
/// handler run inside the engine's sleep would wait for the engine its own thread held.
#[test]
fn a_handler_that_exits_during_a_wait_ends_the_process() {
    run_expecting(
        "exit_in_wait",
        include_str!("c/exit_in_wait.c"),
        &["-libverbs"],
        "127.0.49.26",
        &[],
        &["waiting", "the handler exits"],
    );
}

/// A thread waiting for an event is cancelled as rdma-core's `read()` of the event's
/// descriptor lets it be: rping cancels its CQ thread this way when a connection fails. The
/// cancellation's forced unwind used to meet the library's panic guard and abort the process.
/// With the engine on its own thread the waits sleep on the descriptor; with hybrid or inline
/// progress the CQ's wait runs the engine, and the cancellation is taken once it has let go
/// of it. A cancellation pending as a thread polls (its turns' `recvmsg`), or opens a device
/// (files), aborted the process likewise: it now waits for the program's next cancellation
/// point. The cancelled thread's cleanup runs with its own signal mask, though the wait held
/// its signals off; and a handler that runs during a wait may wait too.
#[test]
fn a_thread_waiting_for_an_event_is_cancelled() {
    let path = compile(
        "cancelled",
        include_str!("c/cancelled.c"),
        &["-lrdmacm", "-libverbs", "-lpthread"],
    );
    for progress in ["hybrid", "thread", "inline"] {
        let lines = [
            "calls with a cancellation pending: 100 polls, closed 1, cancelled after",
            "ibv_get_cq_event: cancelled, cleanup 1, alarm blocked 0",
            "ibv_get_async_event: cancelled, cleanup 1, alarm blocked 0",
            "rdma_get_cm_event: cancelled, cleanup 1, alarm blocked 0",
            "the next cq event: 0, Work Request Flushed Error, wr_id 7",
            "a wait in a handler: -1 Resource temporarily unavailable; the wait: -1 Interrupted system call",
            "the next cm event: 0 RDMA_CM_EVENT_ADDR_RESOLVED",
            "done",
        ];
        run_in_progress("cancelled", &path, "127.0.49.27", &[], progress, &lines);
    }
}

/// A signal handler that jumps out of a wait for a CQ event (an alarm's timeout around
/// `ibv_get_cq_event`, `siglongjmp`) leaves the thread as it leaves rdma-core's `read()`: its
/// cancellation enabled, its mask as saved, the next wait working. With hybrid or inline
/// progress the wait holds the thread's signals off while it runs the engine, and let them in
/// from inside a slice of its work: a jump from there left the thread's cancellation disabled
/// (`round 1: ... cancellation disabled`). A handler with `SA_RESTART` lets the wait go on.
#[test]
fn a_handler_that_jumps_out_of_a_wait_leaves_the_thread_as_it_was() {
    let path = compile(
        "jumped",
        include_str!("c/jumped.c"),
        &["-libverbs", "-lpthread"],
    );
    for progress in ["hybrid", "thread", "inline"] {
        let lines = [
            "round 1: jumped out, alarms 1, cancellation enabled, alarm blocked 0",
            "round 2: jumped out, alarms 2, cancellation enabled, alarm blocked 0",
            "round 3: jumped out, alarms 3, cancellation enabled, alarm blocked 0",
            "the next wait: -1 Interrupted system call, alarms 4",
            "restarted: 0, alarms 5, Work Request Flushed Error, wr_id 9",
            "done",
        ];
        run_in_progress("jumped", &path, "127.0.49.28", &[], progress, &lines);
    }
}

/// Defect 6: a type 1 window could not be unbound (`ibv_bind_mw` with no region answered
/// `EINVAL`), so its region could be deregistered only by deallocating the window.
#[test]
fn a_type_1_window_is_unbound_by_a_bind_with_no_region() {
    run_expecting(
        "unbind",
        include_str!("c/unbind.c"),
        &["-libverbs"],
        "127.0.49.3,127.0.49.4",
        &[],
        &[
            "bound: 1",
            "read through the window: 1",
            "region busy while bound: 1",
            "unbind posted: 0",
            "unbound: 1",
            "region deregistered: 1",
            "old rkey refused: 1",
            "done",
        ],
    );
}

/// Defect 7: destroying a CQ or SRQ a QP uses, or a PD with objects on it, succeeded, and the
/// QP's `send_cq`, `srq` and `pd` then pointed at freed memory.
#[test]
fn objects_in_use_are_not_destroyed() {
    run_expecting(
        "in_use",
        include_str!("c/in_use.c"),
        &["-libverbs"],
        "127.0.49.5",
        &[],
        &[
            "cq in use: 1",
            "srq in use: 1",
            "pd in use: 1",
            "cq still polls: 1",
            "qp still queries: 1",
            "destroyed again: EINVAL",
            "pd with a region: 1",
            "pd with an address handle and a window: 1",
            "pd with a window: 1",
            "all destroyed",
        ],
    );
}
