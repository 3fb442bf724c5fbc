//! A key-value server over RDMA-CM whose every request is awaited by itself: each request
//! posted through a `CompletionRouter` is a future of its own completion, so a round trip
//! reads as one (`recv`, `send`, then the READ of the value), with no loop over the CQ that
//! skips the completions it is not waiting for (compare `tokio_server`).
//!
//! The server keeps four values of 1 MiB in one region and serves a task per connection: a
//! client SENDs a key, the server answers with where the value is (address, length, rkey),
//! and the client READs the value straight from the server's memory. Run with
//! `cargo run --example kv_router`.

use std::net::SocketAddr;

use softroce::prelude::*;
use softroce::verbs::ConnectionRequest;

const PORT: u16 = 7183;
const CLIENTS: usize = 2;
const KEYS: u32 = 4;
const VALUE_LEN: usize = 1 << 20;
/// A request (a key) and a reply (address, length, rkey): the small part of each region.
const KEY_AT: usize = 0;
const REPLY_AT: usize = 64;
const REPLY_LEN: usize = 20;
/// Where the server keeps its values, and a client reads one into.
const VALUES_AT: usize = 4096;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Value `key`'s bytes.
fn value(key: u32) -> Vec<u8> {
    (0..VALUE_LEN)
        .map(|i| (key as usize * 31 + i / 4096) as u8)
        .collect()
}

/// One connection's task: answer each key with where its value is, until the client leaves.
async fn serve(
    request: ConnectionRequest,
    (device, pd, values): (Device, ProtectionDomain, MemoryRegion),
) -> Result<u32, BoxError> {
    let cq = device.create_cq(4)?;
    let router = CompletionRouter::new(cq.clone());
    let mr = pd.register(4096, Access::LOCAL_WRITE)?;
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
    qp.init(Access::LOCAL_WRITE)?;
    // The first key's receive, posted before the accept: the client may send at once.
    let mut next_key = router.recv(&qp, RecvWr::new(0, mr.sge(KEY_AT, 4)?))?;
    let conn = request
        .accept_async(qp, &ConnectOptions::default(), &[])
        .await?;
    let mut served = 0;
    loop {
        let wc = match next_key.await {
            Ok(wc) if wc.status == WcStatus::Success => wc,
            // The client went away: its receive was flushed, or the device says why.
            _ => return Ok(served),
        };
        debug_assert_eq!(wc.byte_len, 4);
        let mut key = [0; 4];
        mr.read(KEY_AT, &mut key)?;
        let key = u32::from_le_bytes(key);
        next_key = router.recv(&conn, RecvWr::new(0, mr.sge(KEY_AT, 4)?))?;
        let at = values.remote().at(key as u64 * VALUE_LEN as u64);
        let at = at.ok_or_else(|| format!("no key {key}"))?;
        let mut reply = [0; REPLY_LEN];
        reply[..8].copy_from_slice(&at.addr.to_le_bytes());
        reply[8..16].copy_from_slice(&(VALUE_LEN as u64).to_le_bytes());
        reply[16..].copy_from_slice(&at.rkey.0.to_le_bytes());
        mr.write(REPLY_AT, &reply)?;
        let sent = router.send(&conn, SendWr::send(1, mr.sge(REPLY_AT, REPLY_LEN)?))?;
        if sent.await?.status != WcStatus::Success {
            return Ok(served);
        }
        served += 1;
    }
}

/// A client: asks for every key in turn and READs each value from the server's memory.
async fn client(n: usize) -> Result<(), BoxError> {
    let device = Device::open(DeviceConfig::udp(format!("127.0.6.{}", 51 + n).parse()?))?;
    let (pd, cq) = (device.alloc_pd()?, device.create_cq(4)?);
    let router = CompletionRouter::new(cq.clone());
    let mr = pd.register(VALUES_AT + VALUE_LEN, Access::LOCAL_WRITE)?;
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
    let server: SocketAddr = format!("127.0.6.50:{PORT}").parse()?;
    let conn = Connection::connect_async(qp, server, &ConnectOptions::default(), &[]).await?;
    for key in 0..KEYS {
        // The round trip: the reply's receive, the key, the reply, the READ, each awaited.
        let reply = router.recv(&conn, RecvWr::new(0, mr.sge(REPLY_AT, REPLY_LEN)?))?;
        mr.write(KEY_AT, &key.to_le_bytes())?;
        router
            .send(&conn, SendWr::send(1, mr.sge(KEY_AT, 4)?))?
            .await?;
        let wc = reply.await?;
        if wc.status != WcStatus::Success || wc.byte_len as usize != REPLY_LEN {
            return Err(format!(
                "client {n}: key {key}: {} ({} bytes)",
                wc.status, wc.byte_len
            )
            .into());
        }
        let mut reply = [0; REPLY_LEN];
        mr.read(REPLY_AT, &mut reply)?;
        let field = |range: std::ops::Range<usize>| {
            let mut bytes = [0; 8];
            bytes[..range.len()].copy_from_slice(&reply[range]);
            u64::from_le_bytes(bytes)
        };
        let remote = RemoteRegion {
            addr: field(0..8),
            len: field(8..16),
            rkey: RKey(field(16..20) as u32),
        };
        let read = SendWr::read(2, mr.sge(VALUES_AT, VALUE_LEN)?, remote);
        let wc = router.send(&conn, read)?.await?;
        if wc.status != WcStatus::Success {
            return Err(format!("client {n}: READ of key {key}: {}", wc.status).into());
        }
        let mut got = vec![0; VALUE_LEN];
        mr.read(VALUES_AT, &mut got)?;
        assert!(got == value(key), "client {n}: key {key}'s value differs");
    }
    println!("client {n}: read {KEYS} values of {VALUE_LEN} bytes");
    conn.disconnect()?;
    conn.ended().await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let device = Device::open(DeviceConfig::udp("127.0.6.50".parse()?))?;
    let pd = device.alloc_pd()?;
    let values = pd.register(
        KEYS as usize * VALUE_LEN,
        Access::LOCAL_WRITE | Access::REMOTE_READ,
    )?;
    for key in 0..KEYS {
        values.write(key as usize * VALUE_LEN, &value(key))?;
    }
    let listener = device.listen(PORT)?;
    let server = tokio::spawn({
        let device = device.clone();
        async move {
            let mut tasks = Vec::new();
            for _ in 0..CLIENTS {
                let request = listener.next().await?;
                let objects = (device.clone(), pd.clone(), values.clone());
                tasks.push(tokio::spawn(serve(request, objects)));
            }
            let mut served = 0;
            for task in tasks {
                served += task.await??;
            }
            Ok::<_, BoxError>(served)
        }
    });
    let clients: Vec<_> = (0..CLIENTS).map(|n| tokio::spawn(client(n))).collect();
    for client in clients {
        client.await??;
    }
    let served = server.await??;
    assert_eq!(served, CLIENTS as u32 * KEYS);
    println!("server: served {served} keys");
    Ok(())
}
