//! An RDMA-CM server on tokio with a task per connection and no thread of its own: the
//! listener's requests, each accept, each connection's completions and its end are all
//! awaited. Each connection has its own completion queue (a CQ is cheap: a channel and an
//! eventfd), so each task awaits only its own completions. Clients connect one after another
//! and each sends a few messages, which its task echoes back in capitals; the first client
//! leaves in the middle of a conversation, and the server goes on serving the next ones. Run
//! with `cargo run --example tokio_server`.

use std::net::SocketAddr;
use std::time::Duration;

use softroce::prelude::*;
use softroce::verbs::{ConnectionEvent, ConnectionRequest};

const PORT: u16 = 7181;
const CLIENTS: usize = 3;
const MESSAGES: usize = 4;
const SLOT: usize = 64;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One connection's task: post a receive per message, echo each one in capitals, and notice
/// the client's end, whether it said goodbye or not.
async fn serve(
    request: ConnectionRequest,
    (device, pd): (Device, ProtectionDomain),
) -> Result<usize, BoxError> {
    let cq = device.create_cq(2 * MESSAGES)?;
    let mr = pd.register(2 * MESSAGES * SLOT, Access::LOCAL_WRITE)?;
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
    qp.init(Access::LOCAL_WRITE)?;
    for m in 0..MESSAGES {
        qp.post_recv(RecvWr::new(m as u64, mr.sge(m * SLOT, SLOT)?))?;
    }
    let peer = request.peer();
    let conn = request
        .accept_async(qp, &ConnectOptions::default(), &[])
        .await?;
    let mut echoed = 0;
    loop {
        tokio::select! {
            wc = cq.next_completion() => {
                let wc = wc?;
                if wc.status == WcStatus::WrFlushErr {
                    continue; // the receives left when the client went away
                }
                if wc.status != WcStatus::Success {
                    return Err(format!("{peer}: {}", wc.status).into());
                }
                if wc.opcode != WcOpcode::Recv {
                    continue;
                }
                let at = wc.wr_id as usize * SLOT;
                let mut text = vec![0; wc.byte_len as usize];
                mr.read(at, &mut text)?;
                let answer_at = (MESSAGES + echoed) * SLOT;
                mr.write(answer_at, &text.to_ascii_uppercase())?;
                conn.post_send(SendWr::send(0, mr.sge(answer_at, text.len())?))?;
                echoed += 1;
            }
            end = conn.ended() => {
                let how = match end? {
                    ConnectionEvent::Disconnected => "disconnected".to_string(),
                    ConnectionEvent::Failed(why) => format!("failed: {why}"),
                    ConnectionEvent::QpFailed(event) => format!("its QP failed: {event:?}"),
                };
                println!("server: {peer} {how} after {echoed} messages");
                return Ok(echoed);
            }
        }
    }
}

/// A client: connects, sends `messages` and checks each echo; the first one leaves without
/// waiting for its last echo, by dropping its connection.
async fn client(n: usize, messages: usize) -> Result<(), BoxError> {
    let device = Device::open(DeviceConfig::udp(format!("127.0.6.{}", 2 + n).parse()?))?;
    let (pd, cq) = (device.alloc_pd()?, device.create_cq(2 * MESSAGES)?);
    let mr = pd.register(2 * SLOT, Access::LOCAL_WRITE)?;
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
    let server: SocketAddr = format!("127.0.6.1:{PORT}").parse()?;
    let conn = Connection::connect_async(qp, server, &ConnectOptions::default(), &[]).await?;
    for m in 0..messages {
        let text = format!("message {m} of client {n}");
        mr.write(0, text.as_bytes())?;
        conn.post_recv(RecvWr::new(1, mr.sge(SLOT, SLOT)?))?;
        conn.post_send(SendWr::send(0, mr.sge(0, text.len())?))?;
        let mut echoed = None;
        while echoed.is_none() {
            let wc = cq.next_completion().await?;
            if wc.status != WcStatus::Success {
                return Err(format!("client {n}: {}", wc.status).into());
            }
            if wc.opcode == WcOpcode::Recv {
                let mut back = vec![0; wc.byte_len as usize];
                mr.read(SLOT, &mut back)?;
                echoed = Some(back);
            }
        }
        assert_eq!(echoed.unwrap(), text.to_ascii_uppercase().into_bytes());
    }
    if n == 0 {
        // Gone in the middle: no disconnect, no wait; dropping the connection sends the DREQ.
        println!("client {n}: leaving after {messages} messages");
        return Ok(());
    }
    conn.disconnect()?;
    match conn.ended().await? {
        ConnectionEvent::Disconnected => println!("client {n}: done, disconnected"),
        other => return Err(format!("client {n}: {other:?}").into()),
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let device = Device::open(DeviceConfig::udp("127.0.6.1".parse()?))?;
    let pd = device.alloc_pd()?;
    let listener = device.listen(PORT)?;
    let server = tokio::spawn({
        let device = device.clone();
        async move {
            let mut tasks = Vec::new();
            for _ in 0..CLIENTS {
                let request = listener.next().await?;
                tasks.push(tokio::spawn(serve(request, (device.clone(), pd.clone()))));
            }
            let mut served = Vec::new();
            for task in tasks {
                served.push(task.await??);
            }
            Ok::<_, BoxError>(served)
        }
    });
    let clients = async {
        for n in 0..CLIENTS {
            let messages = if n == 0 { MESSAGES / 2 } else { MESSAGES };
            client(n, messages).await?;
        }
        Ok::<_, BoxError>(())
    };
    tokio::time::timeout(Duration::from_secs(60), clients).await??;
    let served = tokio::time::timeout(Duration::from_secs(60), server).await???;
    assert_eq!(served, [MESSAGES / 2, MESSAGES, MESSAGES]);
    println!("server: served {CLIENTS} clients, one of which left early: {served:?}");
    Ok(())
}
