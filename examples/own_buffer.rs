//! The application's own buffer as a region: a `Vec<u8>` handed over at registration (no
//! copy), written into by the peer's RDMA WRITE, and handed back whole at deregistration.
//! Run with `cargo run --example own_buffer`.

use std::time::Duration;

use softroce::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (a, b) = (
        Device::open(DeviceConfig::udp("127.0.0.77".parse()?))?,
        Device::open(DeviceConfig::udp("127.0.0.78".parse()?))?,
    );
    let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
    let (cq_a, cq_b) = (a.create_cq(8)?, b.create_cq(8)?);
    let qp_a = pd_a.create_qp().send_cq(&cq_a).recv_cq(&cq_a).build()?;
    let qp_b = pd_b.create_qp().send_cq(&cq_b).recv_cq(&cq_b).build()?;
    qp_a.connect(&qp_b.endpoint(), &ConnectOptions::default())?;
    qp_b.connect(&qp_a.endpoint(), &ConnectOptions::default())?;

    // B's buffer, which it already has: 4 KiB, with whole words of room.
    let mut inbox = Vec::with_capacity(4096);
    inbox.resize(4096, b'.');
    let allocation = inbox.as_ptr();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let target = pd_b
        .register_buffer(inbox, access)
        .map_err(|(_buffer, error)| error)?;

    let source = pd_a.register(64, Access::LOCAL_WRITE)?;
    source.write(0, b"written into the application's own Vec")?;
    qp_a.post_send(SendWr::write(1, source.sge(0, 38)?, target.remote()))?;
    let wc = cq_a.wait(Duration::from_secs(5))?.ok_or("no completion")?;
    assert_eq!(wc.status, WcStatus::Success);

    // Deregister, and the same Vec comes back: the same allocation, the WRITE in it.
    pd_b.deregister(&target)?;
    let inbox = target
        .into_buffer()
        .map_err(|_| "the region is still held")?;
    assert_eq!(inbox.as_ptr(), allocation);
    println!(
        "back in the Vec ({} bytes, same allocation): {:?}",
        inbox.len(),
        String::from_utf8_lossy(&inbox[..40])
    );
    Ok(())
}
