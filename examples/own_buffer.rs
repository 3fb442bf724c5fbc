//! The application's own buffer as a region: the server hands its `Vec<u8>` over at
//! registration (no copy), tells the client where it is in the RDMA-CM accept (a
//! `RemoteRegion`, serialised with the `serde` feature), the client's RDMA WRITE lands in it,
//! and the server gets the same `Vec` back at deregistration.
//! Run with `cargo run --example own_buffer`.

use std::time::Duration;

use softroce::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let within = Duration::from_secs(10);
    let server = Device::open(DeviceConfig::udp("127.0.0.77".parse()?))?;
    let listener = server.listen(7177)?;
    let serving = std::thread::spawn(
        move || -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
            let (pd, cq) = (server.alloc_pd()?, server.create_cq(8)?);
            // The server's buffer, which it already has: 4 KiB, with whole words of room.
            let mut inbox = Vec::with_capacity(4096);
            inbox.resize(4096, b'.');
            let allocation = inbox.as_ptr();
            let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
            let region = pd
                .register_buffer(inbox, access)
                .map_err(|(_buffer, error)| error)?;
            let request = listener.next_request(within)?.expect("a client");
            let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
            let where_to = serde_json::to_vec(&region.remote())?;
            let connection = request.accept(qp, &ConnectOptions::default(), &where_to)?;
            // The client says it is done by disconnecting, once its WRITE has completed.
            let ended = connection.wait_event(within)?;
            assert!(
                matches!(ended, Some(ConnectionEvent::Disconnected)),
                "{ended:?}"
            );
            pd.deregister(&region)?;
            let inbox = region
                .into_buffer()
                .map_err(|_| "the region is still held")?;
            assert_eq!(
                inbox.as_ptr(),
                allocation,
                "the same allocation, not a copy"
            );
            Ok(inbox)
        },
    );

    let client = Device::open(DeviceConfig::udp("127.0.0.78".parse()?))?;
    let (pd, cq) = (client.alloc_pd()?, client.create_cq(8)?);
    let source = pd.register(64, Access::LOCAL_WRITE)?;
    source.write(0, b"written into the server's own Vec")?;
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
    let connection = Connection::connect(
        qp,
        "127.0.0.77:7177".parse()?,
        &ConnectOptions::default(),
        &[],
    )?;
    // The REP's private data is zero-padded: the JSON ends at the first zero.
    let data = connection.private_data();
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let target: RemoteRegion = serde_json::from_slice(&data[..end])?;
    connection.post_send(SendWr::write(1, source.sge(0, 33)?, target))?;
    let wc = cq.wait(within)?.ok_or("no completion")?;
    assert_eq!(wc.status, WcStatus::Success);
    connection.disconnect()?;

    let inbox = serving
        .join()
        .expect("the server thread")
        .map_err(|e| e.to_string())?;
    println!(
        "back in the server's Vec ({} bytes, same allocation): {:?}",
        inbox.len(),
        String::from_utf8_lossy(&inbox[..36])
    );
    Ok(())
}
