//! Two devices on loopback: connect an RC queue pair, RDMA WRITE a greeting into the peer's
//! memory, READ it back, and print both. Run with `cargo run --example rc_write_read`.

use std::time::Duration;

use softroce::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut ends = Vec::new();
    for address in ["127.0.0.5", "127.0.0.6"] {
        let device = Device::open(DeviceConfig::udp(address.parse()?))?;
        let pd = device.alloc_pd()?;
        let cq = device.create_cq(16)?;
        let mr = pd.register(4096, access)?;
        let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
        ends.push((device, cq, mr, qp));
    }
    let (_, cq, local, qp) = &ends[0];
    let (_, _, remote, peer_qp) = &ends[1];

    // What an out-of-band exchange carries: each side's endpoint (address, QPN, the PSN it
    // sends from, its MTU) and the region the peer may reach.
    let options = ConnectOptions::default();
    qp.connect(&peer_qp.endpoint(), &options)?;
    peer_qp.connect(&qp.endpoint(), &options)?;
    let target: RemoteRegion = remote.remote();

    let greeting = b"hello over RoCEv2, from a host with no RDMA NIC";
    let len = greeting.len();
    local.write(0, greeting)?;
    qp.post_send(SendWr::write(1, local.sge(0, len)?, target))?;
    qp.post_send(SendWr::read(2, local.sge(1024, len)?, target))?;
    for _ in 0..2 {
        let wc = cq
            .wait(Duration::from_secs(5))?
            .ok_or("no completion within 5 s")?;
        if wc.status != WcStatus::Success {
            return Err(format!("work request {} failed: {}", wc.wr_id, wc.status).into());
        }
    }

    let mut landed = vec![0; len];
    remote.read(0, &mut landed)?;
    let mut back = vec![0; len];
    local.read(1024, &mut back)?;
    println!("written to the peer: {}", String::from_utf8_lossy(&landed));
    println!("read back:           {}", String::from_utf8_lossy(&back));
    assert_eq!(back, greeting);
    Ok(())
}
