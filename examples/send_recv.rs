//! SEND and RECEIVE on an RC connection made by RDMA-CM: the server posts its receive buffers
//! before it accepts, the client's messages land in them in order, and each receive completion
//! says how many bytes came and the immediate data if any. Run with
//! `cargo run --example send_recv`.

use std::time::Duration;

use softroce::prelude::*;

const MESSAGES: [&[u8]; 3] = [b"first", b"second, with immediate data", b"third, inline"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let within = Duration::from_secs(10);
    let server = Device::open(DeviceConfig::udp("127.0.0.73".parse()?))?;
    let listener = server.listen(7175)?;
    let serving = std::thread::spawn(move || -> Result<(), Error> {
        let (pd, cq) = (server.alloc_pd()?, server.create_cq(16)?);
        let inbox = pd.register(4096, Access::LOCAL_WRITE)?;
        let request = listener.next_request(within)?.expect("a client");
        // Receives can wait in INIT, before the connection: one 256-byte buffer per message.
        let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
        qp.init(Access::LOCAL_WRITE)?;
        for slot in 0..MESSAGES.len() {
            qp.post_recv(RecvWr::new(slot as u64, inbox.sge(slot * 256, 256)?))?;
        }
        let _connection = request.accept(qp, &ConnectOptions::default(), &[])?;
        for _ in 0..MESSAGES.len() {
            let wc = cq.wait(within)?.expect("a receive completion");
            assert_eq!(wc.status, WcStatus::Success, "receive {}", wc.wr_id);
            let mut text = vec![0; wc.byte_len as usize];
            inbox.read(wc.wr_id as usize * 256, &mut text)?;
            assert_eq!(text, MESSAGES[wc.wr_id as usize]);
            println!(
                "receive {}: {} bytes {:?}, immediate {:?}",
                wc.wr_id,
                wc.byte_len,
                String::from_utf8_lossy(&text),
                wc.imm_data
            );
        }
        Ok(())
    });

    let client = Device::open(DeviceConfig::udp("127.0.0.74".parse()?))?;
    let (pd, cq) = (client.alloc_pd()?, client.create_cq(16)?);
    let outbox = pd.register(4096, Access::LOCAL_WRITE)?;
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
    let connection = Connection::connect(
        qp,
        "127.0.0.73:7175".parse()?,
        &ConnectOptions::default(),
        &[],
    )?;
    outbox.write(0, MESSAGES[0])?;
    outbox.write(256, MESSAGES[1])?;
    connection.post_send_batch([
        SendWr::send(1, outbox.sge(0, MESSAGES[0].len())?),
        SendWr::send_imm(2, outbox.sge(256, MESSAGES[1].len())?, 0xcafe),
        SendWr::send_inline(3, MESSAGES[2]),
    ])?;
    for _ in 0..MESSAGES.len() {
        let sent = cq.wait(within)?.ok_or("no send completion")?;
        assert_eq!(sent.status, WcStatus::Success, "send {}", sent.wr_id);
    }
    serving.join().expect("the server thread")?;
    Ok(())
}
