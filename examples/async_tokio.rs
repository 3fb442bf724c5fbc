//! One tokio task serves four RC queue pairs: it awaits their shared completion queue (no
//! thread blocked in the CQ), and answers each message that arrives, on whichever QP, with an
//! RDMA WRITE with immediate of the message in capitals, back to where the client sent it
//! from. The client awaits its own CQ the same way, on the same runtime thread. Run with
//! `cargo run --example async_tokio`.
//!
//! `CompletionQueue::next_completion` is a plain future, for any executor. A reactor that
//! wants the descriptor instead has it: the CQ is `AsFd`, readable after `req_notify`.

use std::time::Duration;

use softroce::prelude::*;

const QPS: usize = 4;
const MESSAGES: usize = 8;
const SLOT: usize = 64;

/// A device, a protection domain, one CQ for everything, a region, and `QPS` queue pairs.
struct Side {
    _device: Device,
    cq: CompletionQueue,
    mr: MemoryRegion,
    qps: Vec<QueuePair>,
}

fn side(address: &str) -> Result<Side, Error> {
    let device = Device::open(DeviceConfig::udp(address.parse().unwrap()))?;
    let pd = device.alloc_pd()?;
    let cq = device.create_cq(256)?;
    let mr = pd.register(
        QPS * MESSAGES * SLOT,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )?;
    let qps = (0..QPS)
        .map(|_| pd.create_qp().send_cq(&cq).recv_cq(&cq).build())
        .collect::<Result<_, _>>()?;
    Ok(Side {
        _device: device,
        cq,
        mr,
        qps,
    })
}

/// The server: every message that arrives on any QP is answered by a WRITE with immediate into
/// the client's memory, at the same place; the task ends when every answer has completed
/// (dropping the QPs earlier would flush the answers not yet acknowledged).
async fn serve(server: Side, answers_to: RemoteRegion) -> Result<(), Box<dyn std::error::Error>> {
    for (q, qp) in server.qps.iter().enumerate() {
        for m in 0..MESSAGES {
            let at = (q * MESSAGES + m) * SLOT;
            qp.post_recv(RecvWr::new(at as u64, server.mr.sge(at, SLOT)?))?;
        }
    }
    let (mut answered, mut delivered) = (0, 0);
    while delivered < QPS * MESSAGES {
        let wc = server.cq.next_completion().await?;
        if wc.status != WcStatus::Success {
            return Err(format!("work request {}: {}", wc.wr_id, wc.status).into());
        }
        if wc.opcode == WcOpcode::RdmaWrite {
            delivered += 1;
            continue;
        }
        let qp = server.qps.iter().find(|qp| qp.qpn() == wc.qp_num).unwrap();
        let at = wc.wr_id as usize;
        let mut text = [0u8; SLOT];
        server.mr.read(at, &mut text)?;
        server.mr.write(at, &text.to_ascii_uppercase())?;
        let target = answers_to.at(at as u64).unwrap();
        let answer = SendWr::write_imm(0, server.mr.sge(at, SLOT)?, target, at as u32);
        qp.post_send(answer)?;
        answered += 1;
    }
    assert_eq!(answered, QPS * MESSAGES);
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (server, client) = (side("127.0.0.71")?, side("127.0.0.72")?);
    let options = ConnectOptions::default();
    for (s, c) in server.qps.iter().zip(&client.qps) {
        s.connect(&c.endpoint(), &options)?;
        c.connect(&s.endpoint(), &options)?;
    }
    let answers_to = client.mr.remote();
    let serving =
        tokio::spawn(async move { serve(server, answers_to).await.map_err(|e| e.to_string()) });

    for (q, qp) in client.qps.iter().enumerate() {
        for m in 0..MESSAGES {
            let at = (q * MESSAGES + m) * SLOT;
            let text = format!("message {m} on QP {q}");
            client.mr.write(at, text.as_bytes())?;
            // A WRITE with immediate consumes a receive, which takes no bytes.
            qp.post_recv(RecvWr::new(0, SgeList::new()))?;
            qp.post_send(SendWr::send(at as u64, client.mr.sge(at, SLOT)?))?;
        }
    }
    let mut answered = Vec::new();
    for _ in 0..2 * QPS * MESSAGES {
        let wc =
            tokio::time::timeout(Duration::from_secs(10), client.cq.next_completion()).await??;
        if wc.status != WcStatus::Success {
            return Err(format!("work request {}: {}", wc.wr_id, wc.status).into());
        }
        if let Some(at) = wc.imm_data {
            answered.push(at as usize);
        }
    }
    serving.await??;
    answered.sort_unstable();
    assert_eq!(
        answered,
        (0..QPS * MESSAGES).map(|i| i * SLOT).collect::<Vec<_>>()
    );
    for at in answered {
        let mut text = [0u8; SLOT];
        client.mr.read(at, &mut text)?;
        let end = text.iter().position(|&b| b == 0).unwrap_or(SLOT);
        let (q, m) = (at / SLOT / MESSAGES, at / SLOT % MESSAGES);
        assert_eq!(&text[..end], format!("MESSAGE {m} ON QP {q}").as_bytes());
    }
    println!(
        "{} messages on {QPS} QPs, each answered in capitals by one task waiting on one CQ",
        QPS * MESSAGES
    );
    Ok(())
}
