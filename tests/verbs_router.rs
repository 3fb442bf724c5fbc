//! `CompletionRouter`: requests awaited each by its own future (issue 54, item 5), on two
//! devices on loopback (127.0.6.60 to 127.0.6.69). Before it, every request and response needed
//! a loop over the CQ that skipped the completions it was not waiting for.

use std::time::Duration;

use softroce::prelude::*;
use softroce::verbs::Routed;

const WAIT: Duration = Duration::from_secs(10);

/// Two connected RC QPs on devices at `127.0.6.{first}` and the next address, each with its
/// CQ, a router of it and a 64 KiB region.
struct Ends {
    devices: [Device; 2],
    qps: [QueuePair; 2],
    routers: [CompletionRouter; 2],
    mrs: [MemoryRegion; 2],
}

fn ends(first: u8, max_send_wr: usize) -> Ends {
    let devices = [first, first + 1].map(|last| {
        Device::open(DeviceConfig::udp(
            format!("127.0.6.{last}").parse().unwrap(),
        ))
        .unwrap()
    });
    let pds = [0, 1].map(|k| devices[k].alloc_pd().unwrap());
    let cqs = [0, 1].map(|k| devices[k].create_cq(256).unwrap());
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mrs = [0, 1].map(|k| pds[k].register(64 << 10, access).unwrap());
    let qps = [0, 1].map(|k| {
        pds[k]
            .create_qp()
            .send_cq(&cqs[k])
            .recv_cq(&cqs[k])
            .max_send_wr(max_send_wr)
            .max_recv_wr(128)
            .build()
            .unwrap()
    });
    let options = ConnectOptions {
        rnr_retry: 7,
        ..ConnectOptions::default()
    };
    qps[0].connect(&qps[1].endpoint(), &options).unwrap();
    qps[1].connect(&qps[0].endpoint(), &options).unwrap();
    let routers = [0, 1].map(|k| CompletionRouter::new(cqs[k].clone()));
    Ends {
        devices,
        qps,
        routers,
        mrs,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Many requests in flight on one CQ, awaited by several tasks in whatever order they run:
/// each future resolves with its own completion, its `wr_id` the caller's, and none strays.
/// Receives too: each SEND's receive resolves with its own bytes.
#[test]
fn requests_in_flight_each_resolve_with_their_own_completion() {
    let e = ends(60, 128);
    let rt = runtime();
    let done = rt.block_on(async {
        // 16 receives on B, awaited from the last posted to the first.
        let mut receives: Vec<Routed> = (0..16u64)
            .map(|i| {
                let wr = RecvWr::new(1000 + i, e.mrs[1].sge(i as usize * 64, 64).unwrap());
                e.routers[1].recv(&e.qps[1], wr).unwrap()
            })
            .collect();
        // 64 WRITEs and 16 SENDs from A, four tasks awaiting 20 each.
        let mut tasks = Vec::new();
        for task in 0..4u64 {
            let futures: Vec<(u64, Routed)> = (0..20u64)
                .map(|k| {
                    let wr_id = task * 100 + k;
                    let at = (wr_id % 64) as usize * 8;
                    e.mrs[0].write(at, &wr_id.to_le_bytes()).unwrap();
                    let sge = [e.mrs[0].sge(at, 8).unwrap()];
                    let wr = if k < 4 {
                        SendWr::send(wr_id, sge)
                    } else {
                        SendWr::write(wr_id, sge, e.mrs[1].remote().at(32 << 10).unwrap())
                    };
                    (wr_id, e.routers[0].send(&e.qps[0], wr).unwrap())
                })
                .collect();
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                for (wr_id, routed) in futures.into_iter().rev() {
                    let wc = tokio::time::timeout(WAIT, routed).await.unwrap().unwrap();
                    assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
                    seen.push(wr_id);
                }
                seen.len()
            }));
        }
        let mut sent = 0;
        for task in tasks {
            sent += task.await.unwrap();
        }
        let mut received = Vec::new();
        while let Some(routed) = receives.pop() {
            let wc = tokio::time::timeout(WAIT, routed).await.unwrap().unwrap();
            assert_eq!(wc.status, WcStatus::Success);
            received.push(wc.wr_id);
        }
        (sent, received)
    });
    assert_eq!(done.0, 80);
    let mut received = done.1;
    received.sort_unstable();
    assert_eq!(received, (1000..1016).collect::<Vec<_>>());
    // Each SEND's 8 bytes (its wr_id) landed in the receive that took it.
    for i in 0..16 {
        let mut bytes = [0; 8];
        e.mrs[1].read(i * 64, &mut bytes).unwrap();
        assert!(
            u64::from_le_bytes(bytes) % 100 < 4,
            "receive {i}: {bytes:?}"
        );
    }
    assert_eq!((e.routers[0].strays(), e.routers[1].strays()), (0, 0));
}

/// A future dropped before its completion lets the completion go when it comes, and the router
/// goes on; a post the QP refuses (its send queue full) is refused at the call, and takes no
/// slot.
#[test]
fn a_dropped_future_and_a_refused_post_leave_the_router_as_it_was() {
    let e = ends(62, 1);
    let rt = runtime();
    rt.block_on(async {
        // No receive on B yet: the SEND waits in RNR retries.
        let send = e.routers[0]
            .send(&e.qps[0], SendWr::send(1, [e.mrs[0].sge(0, 8).unwrap()]))
            .unwrap();
        let refused = e.routers[0].send(&e.qps[0], SendWr::send(2, [e.mrs[0].sge(0, 8).unwrap()]));
        assert!(
            matches!(refused, Err(Error::QueueFull { .. })),
            "{refused:?}"
        );
        drop(send);
        let recv = e.routers[1]
            .recv(&e.qps[1], RecvWr::new(3, e.mrs[1].sge(0, 64).unwrap()))
            .unwrap();
        let wc = tokio::time::timeout(WAIT, recv).await.unwrap().unwrap();
        assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
        // The dropped SEND's completion has come (the receive completed after its data):
        // the next request finds the queue free and completes by itself.
        let mut again = None;
        for _ in 0..100 {
            let wr = SendWr::write(4, [e.mrs[0].sge(0, 8).unwrap()], e.mrs[1].remote());
            match e.routers[0].send(&e.qps[0], wr) {
                Ok(routed) => {
                    again = Some(routed);
                    break;
                }
                // The SEND's ACK may not be in yet.
                Err(Error::QueueFull { .. }) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(other) => panic!("{other}"),
            }
        }
        let wc = tokio::time::timeout(WAIT, again.expect("a free send queue"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((wc.wr_id, wc.status), (4, WcStatus::Success));
    });
    assert_eq!(e.routers[0].strays(), 0);
}

/// Awaited requests of a device that closes resolve, flushed, instead of waiting for ever; a
/// request awaited after the flush learns why.
#[test]
fn awaited_requests_of_a_closed_device_resolve() {
    let e = ends(64, 4);
    let rt = runtime();
    rt.block_on(async {
        // No receive on B: the SEND waits in RNR retries (rnr_retry 7: for ever).
        let send = e.routers[0]
            .send(&e.qps[0], SendWr::send(1, [e.mrs[0].sge(0, 8).unwrap()]))
            .unwrap();
        let waiting = tokio::spawn(send);
        tokio::time::sleep(Duration::from_millis(50)).await;
        e.devices[0].close();
        let wc = tokio::time::timeout(WAIT, waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::WrFlushErr));
        let after = e.routers[0].send(&e.qps[0], SendWr::send(2, [e.mrs[0].sge(0, 8).unwrap()]));
        assert!(matches!(after, Err(Error::DeviceClosed)), "{after:?}");
    });
}

/// A task woken by a completion that was not its own, and that then does something else for a
/// while (its future held, not polled: a `select!` arm, a timeout retried later), held the
/// CQ's only waker when the CQ's waker was the last polled future's: another task's completion
/// woke it, and nobody else. The CQ's waker is the router's now, and wakes every waiting task.
#[test]
fn a_task_holding_its_future_unpolled_does_not_starve_the_others() {
    let e = ends(66, 16);
    let rt = runtime();
    rt.block_on(async {
        // No receive on B yet: the SEND waits in RNR retries, and the WRITE behind it.
        let send = e.routers[0]
            .send(&e.qps[0], SendWr::send(1, [e.mrs[0].sge(0, 8).unwrap()]))
            .unwrap();
        let sender = tokio::spawn(send);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let write = SendWr::write(2, [e.mrs[0].sge(0, 8).unwrap()], e.mrs[1].remote());
        let held = e.routers[0].send(&e.qps[0], write).unwrap();
        let holder = tokio::spawn(async move {
            let mut held = held;
            // Polled once, then left: the task sleeps with its future in hand.
            tokio::select! {
                biased;
                _ = &mut held => panic!("the WRITE completed before the SEND it follows"),
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            held.await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let recv = e.routers[1]
            .recv(&e.qps[1], RecvWr::new(3, e.mrs[1].sge(0, 64).unwrap()))
            .unwrap();
        let wc = tokio::time::timeout(Duration::from_secs(2), sender)
            .await
            .expect("the SEND's task was woken")
            .unwrap()
            .unwrap();
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
        assert_eq!(recv.await.unwrap().wr_id, 3);
        let wc = holder.await.unwrap().unwrap();
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    });
}

/// Requests posted and let go of (a WRITE whose completion nobody awaits) left their
/// completions in the CQ until some future was polled: a thousand of them overran a CQ of 256,
/// and the QP went to ERROR. Each post takes what the CQ holds first.
#[test]
fn requests_let_go_of_do_not_pile_up_in_the_cq() {
    let e = ends(68, 64);
    let rt = runtime();
    rt.block_on(async {
        for i in 0..1000u64 {
            loop {
                let wr = SendWr::write(i, [e.mrs[0].sge(0, 8).unwrap()], e.mrs[1].remote());
                match e.routers[0].send(&e.qps[0], wr) {
                    Ok(routed) => {
                        drop(routed);
                        break;
                    }
                    Err(Error::QueueFull { .. }) => {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(other) => panic!("WRITE {i}: {other}"),
                }
            }
        }
        let wr = SendWr::write(1000, [e.mrs[0].sge(0, 8).unwrap()], e.mrs[1].remote());
        let routed = e.routers[0].send(&e.qps[0], wr).unwrap();
        let wc = tokio::time::timeout(WAIT, routed).await.unwrap().unwrap();
        assert_eq!((wc.wr_id, wc.status), (1000, WcStatus::Success));
    });
    assert_eq!(e.routers[0].strays(), 0);
}
