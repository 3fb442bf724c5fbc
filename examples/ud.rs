//! Unreliable datagrams, found by RDMA-CM: the server's UD QP answers service resolution
//! (SIDR) on a port of RDMA-CM's UDP space, the client resolves it to the QP's address, number
//! and Q_Key and sends to it by address handle, with no connection. Each received message is
//! preceded in its buffer by the 40 bytes verbs set aside for the GRH. Run with
//! `cargo run --example ud`.

use std::time::Duration;

use softroce::cm::RDMA_UDP_QKEY;
use softroce::prelude::*;
use softroce::transport::GRH_LEN;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let within = Duration::from_secs(10);
    let server = Device::open(DeviceConfig::udp("127.0.0.75".parse()?))?;
    let (pd, cq) = (server.alloc_pd()?, server.create_cq(16)?);
    let inbox = pd.register(4096, Access::LOCAL_WRITE)?;
    // RDMA-CM's UD QPs check its well-known Q_Key.
    let qp = pd
        .create_qp()
        .qp_type(QpType::Ud)
        .qkey(RDMA_UDP_QKEY)
        .send_cq(&cq)
        .recv_cq(&cq)
        .build()?;
    qp.ready_datagram()?;
    qp.post_recv(RecvWr::new(7, inbox.sge(0, GRH_LEN + 1024)?))?;
    let listener = server.listen_datagram(7176)?;
    let answering = std::thread::spawn(move || -> Result<QueuePair, Error> {
        let request = listener.next_request(within)?.expect("a client");
        request.reply(&qp, &[])?;
        Ok(qp)
    });

    let client = Device::open(DeviceConfig::udp("127.0.0.76".parse()?))?;
    let (client_pd, client_cq) = (client.alloc_pd()?, client.create_cq(16)?);
    let outbox = client_pd.register(4096, Access::LOCAL_WRITE)?;
    let sender = client_pd
        .create_qp()
        .qp_type(QpType::Ud)
        .qkey(RDMA_UDP_QKEY)
        .send_cq(&client_cq)
        .recv_cq(&client_cq)
        .build()?;
    sender.ready_datagram()?;
    let server_qp = client.resolve_datagram("127.0.0.75:7176".parse()?, &[])?;
    let _qp = answering.join().expect("the server thread")?;
    let dest = server_qp.dest(client_pd.create_ah(server_qp.addr)?);
    let text = b"a datagram, no connection needed";
    outbox.write(0, text)?;
    sender.post_send(SendWr::send(1, outbox.sge(0, text.len())?).to(dest))?;

    let sent = client_cq.wait(within)?.ok_or("no send completion")?;
    assert_eq!(sent.status, WcStatus::Success);
    let wc = cq.wait(within)?.ok_or("no receive completion")?;
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
