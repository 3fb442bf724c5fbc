//! An RC connection made by RDMA-CM, and one RDMA WRITE over it: two softroce devices on
//! loopback, the server listening on port 7174 as rping's does.
use softroce::prelude::*;
use std::time::Duration;

fn main() -> Result<(), Error> {
    let server = Device::open(DeviceConfig::udp("127.0.0.51".parse().unwrap()))?;
    let (pd, cq, listener) = (
        server.alloc_pd()?,
        server.create_cq(8)?,
        server.listen(7174)?,
    );
    let target = pd.register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    // What the server would send the client: in rping, inside the RDMA-CM private data.
    let target_region = target.remote();
    let accepted = std::thread::spawn(move || -> Result<Connection, Error> {
        let request = listener
            .next_request(Duration::from_secs(10))?
            .expect("a client");
        let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
        request.accept(qp, &ConnectOptions::default(), b"welcome")
    });

    let client = Device::open(DeviceConfig::udp("127.0.0.52".parse().unwrap()))?;
    let (pd, cq) = (client.alloc_pd()?, client.create_cq(8)?);
    let source = pd.register(64, Access::LOCAL_WRITE)?;
    source.write(0, b"hello over RDMA-CM")?;
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build()?;
    let conn = Connection::connect(
        qp,
        "127.0.0.51:7174".parse().unwrap(),
        &ConnectOptions::default(),
        &[],
    )?;
    let _server_side = accepted.join().expect("the server thread")?;
    conn.post_send(SendWr::write(1, source.sge(0, 18)?, target_region))?;
    let done = cq.wait(Duration::from_secs(10))?.expect("a completion");
    assert_eq!(done.status, WcStatus::Success);
    assert_eq!(&target.to_vec()[..18], b"hello over RDMA-CM");
    let greeting = String::from_utf8_lossy(&conn.private_data()[..7]);
    println!("the WRITE landed; the server's REP said {greeting:?}");
    Ok(())
}
