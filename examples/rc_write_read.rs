//! Two devices on loopback: connect an RC queue pair, RDMA WRITE a greeting into the peer's
//! memory, READ it back, and print both. Run with `cargo run --example rc_write_read`.

use std::time::Duration;

use softroce::memory::Access;
use softroce::transport::{Payload, SendOp, SendWr, Sge, WcStatus};
use softroce::verbs::{ConnectOptions, Device, DeviceConfig, Remote};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addresses = ["127.0.0.5".parse()?, "127.0.0.6".parse()?];
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut ends = Vec::new();
    for address in addresses {
        let device = Device::open(DeviceConfig::udp(address))?;
        let pd = device.alloc_pd()?;
        let cq = device.create_cq(16)?;
        let mr = pd.register(4096, access)?;
        let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
        ends.push((device, cq, mr, qp));
    }
    let (_, cq, local, qp) = &ends[0];
    let (_, _, remote, peer_qp) = &ends[1];

    // What an out-of-band exchange would carry: address, QPN and starting PSN of each side.
    let options = ConnectOptions::default();
    qp.connect(
        &Remote {
            addr: addresses[1],
            qpn: peer_qp.qpn(),
            psn: 7,
        },
        3,
        &options,
    )?;
    peer_qp.connect(
        &Remote {
            addr: addresses[0],
            qpn: qp.qpn(),
            psn: 3,
        },
        7,
        &options,
    )?;

    let greeting = b"hello over RoCEv2, from a host with no RDMA NIC";
    local.write(0, greeting)?;
    let len = greeting.len();
    let write = SendOp::Write {
        remote_addr: remote.iova(),
        rkey: remote.rkey(),
    };
    qp.post_send(SendWr::new(
        1,
        write,
        Payload::Sges(vec![Sge::new(local, 0, len)]),
    ))?;
    let read = SendOp::Read {
        remote_addr: remote.iova(),
        rkey: remote.rkey(),
    };
    qp.post_send(SendWr::new(
        2,
        read,
        Payload::Sges(vec![Sge::new(local, 1024, len)]),
    ))?;
    for _ in 0..2 {
        let wc = cq
            .wait(Duration::from_secs(5))?
            .ok_or("no completion within 5 s")?;
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
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
