//! SEND and RECEIVE on an RC queue pair: the receiver posts buffers first, the sender's
//! messages land in them in order, and each receive completion says how many bytes came and
//! the immediate data if any. Run with `cargo run --example send_recv`.

use std::time::Duration;

use softroce::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut ends = Vec::new();
    for address in ["127.0.0.73", "127.0.0.74"] {
        let device = Device::open(DeviceConfig::udp(address.parse()?))?;
        let pd = device.alloc_pd()?;
        let cq = device.create_cq(16)?;
        let mr = pd.register(4096, Access::LOCAL_WRITE)?;
        let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
        ends.push((device, cq, mr, qp));
    }
    let (_, sender_cq, outbox, sender) = &ends[0];
    let (_, receiver_cq, inbox, receiver) = &ends[1];

    // Receives can wait in INIT, before the connection: post one 256-byte buffer per message.
    receiver.init(Access::LOCAL_WRITE)?;
    for slot in 0..3 {
        receiver.post_recv(RecvWr::new(slot, inbox.sge(slot as usize * 256, 256)?))?;
    }
    sender.connect(&receiver.endpoint(), &ConnectOptions::default())?;
    receiver.connect(&sender.endpoint(), &ConnectOptions::default())?;

    let messages: [&[u8]; 3] = [b"first", b"second, with immediate data", b"third, inline"];
    outbox.write(0, messages[0])?;
    outbox.write(256, messages[1])?;
    let len = |m: &[u8]| m.len();
    sender.post_send_batch([
        SendWr::send(1, outbox.sge(0, len(messages[0]))?),
        SendWr::send_imm(2, outbox.sge(256, len(messages[1]))?, 0xcafe),
        SendWr::send_inline(3, messages[2]),
    ])?;

    let within = Duration::from_secs(5);
    for _ in 0..3 {
        let sent = sender_cq.wait(within)?.ok_or("no send completion")?;
        assert_eq!(sent.status, WcStatus::Success, "send {}", sent.wr_id);
        let wc = receiver_cq.wait(within)?.ok_or("no receive completion")?;
        assert_eq!(wc.status, WcStatus::Success, "receive {}", wc.wr_id);
        let mut text = vec![0; wc.byte_len as usize];
        inbox.read(wc.wr_id as usize * 256, &mut text)?;
        assert_eq!(text, messages[wc.wr_id as usize]);
        println!(
            "receive {}: {} bytes {:?}, immediate {:?}",
            wc.wr_id,
            wc.byte_len,
            String::from_utf8_lossy(&text),
            wc.imm_data
        );
    }
    Ok(())
}
