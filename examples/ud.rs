//! Unreliable datagrams: one UD queue pair sends to another by address handle, with no
//! connection. Each received message is preceded in its buffer by the 40 bytes verbs set aside
//! for the GRH. Run with `cargo run --example ud`.

use std::time::Duration;

use softroce::prelude::*;
use softroce::transport::GRH_LEN;

const QKEY: QKey = QKey(0x1111_1111);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut ends = Vec::new();
    for address in ["127.0.0.75", "127.0.0.76"] {
        let device = Device::open(DeviceConfig::udp(address.parse()?))?;
        let pd = device.alloc_pd()?;
        let cq = device.create_cq(16)?;
        let mr = pd.register(4096, Access::LOCAL_WRITE)?;
        let qp = pd
            .create_qp()
            .qp_type(QpType::Ud)
            .qkey(QKEY)
            .send_cq(&cq)
            .recv_cq(&cq)
            .build()?;
        qp.ready_datagram()?;
        ends.push((device, pd, cq, mr, qp));
    }
    let (_, pd, sender_cq, outbox, sender) = &ends[0];
    let (_, _, receiver_cq, inbox, receiver) = &ends[1];

    receiver.post_recv(RecvWr::new(7, inbox.sge(0, GRH_LEN + 1024)?))?;
    // What the receiver would publish: its address, QPN and Q_Key.
    let them = receiver.endpoint();
    let dest = UdDest {
        ah: pd.create_ah(them.addr)?,
        remote_qpn: them.qpn,
        remote_qkey: them.qkey,
    };
    let text = b"a datagram, no connection needed";
    outbox.write(0, text)?;
    sender.post_send(SendWr::send(1, outbox.sge(0, text.len())?).to(dest))?;

    let within = Duration::from_secs(5);
    let sent = sender_cq.wait(within)?.ok_or("no send completion")?;
    assert_eq!(sent.status, WcStatus::Success);
    let wc = receiver_cq.wait(within)?.ok_or("no receive completion")?;
    assert_eq!(wc.status, WcStatus::Success);
    let mut got = vec![0; wc.byte_len as usize - GRH_LEN];
    inbox.read(GRH_LEN, &mut got)?;
    assert_eq!(got, text);
    println!(
        "from QP {:?} at {:?}: {:?}",
        wc.src_qp,
        wc.src_addr,
        String::from_utf8_lossy(&got)
    );
    Ok(())
}
