//! Many processes on one address, through the Rust API (issue 51): each test runs devices in
//! processes of their own (this test binary again, its `child` entry point told what to do by
//! `SHARED_ADDRESS_CHILD`), all on one address, and talks to them from another.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use softroce::prelude::*;

const WAIT: Duration = Duration::from_secs(10);
const ROLE: &str = "SHARED_ADDRESS_CHILD";

fn device(addr: &str) -> Device {
    let mut config = DeviceConfig::udp(addr.parse().unwrap());
    config.keepalive = None;
    Device::open(config).unwrap()
}

/// A process of this binary running `role`, on standard input and output.
struct Process {
    child: Child,
    stdin: ChildStdin,
    lines: BufReader<ChildStdout>,
}

impl Process {
    fn start(role: &str) -> Process {
        Self::start_as(role, None)
    }

    fn start_as(role: &str, user: Option<&str>) -> Process {
        let exe = std::env::current_exe().unwrap();
        let mut command = match user {
            Some(uid) => {
                let mut c = Command::new("setpriv");
                c.args([
                    &format!("--reuid={uid}"),
                    &format!("--regid={uid}"),
                    "--clear-groups",
                ])
                .arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let mut child = command
            .args([
                "--exact",
                "child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Process {
            stdin: child.stdin.take().unwrap(),
            lines: BufReader::new(child.stdout.take().unwrap()),
            child,
        }
    }

    /// The child's next line of its own (the test harness's are skipped).
    fn said(&mut self) -> String {
        loop {
            let mut line = String::new();
            assert!(
                self.lines.read_line(&mut line).unwrap() > 0,
                "the child ended before it said what it was asked"
            );
            // The harness may have begun the line ("test child ... ").
            if let Some((_, said)) = line.trim_end().split_once("child: ") {
                return said.to_string();
            }
        }
    }

    fn tell(&mut self, what: &str) {
        writeln!(self.stdin, "{what}").unwrap();
    }

    fn wait_success(mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the child ended with {status}");
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A value said as `name=value`.
fn value_of(said: &str, name: &str) -> u64 {
    said.split_whitespace()
        .find_map(|word| word.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {said:?}"))
        .parse()
        .unwrap()
}

/// The connection's QP: one CQ for both queues, a region of 64 bytes.
struct Ends {
    cq: CompletionQueue,
    mr: MemoryRegion,
    conn: Connection,
}

fn connect(client: &Device, to: SocketAddr) -> Ends {
    let pd = client.alloc_pd().unwrap();
    let cq = client.create_cq(8).unwrap();
    let mr = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    let conn = Connection::connect(qp, to, &ConnectOptions::default(), &[]).unwrap();
    Ends { cq, mr, conn }
}

/// SENDs `message`, and waits for the peer's echo of it.
fn echo(ends: &Ends, message: &[u8]) -> Vec<u8> {
    ends.conn
        .post_recv(RecvWr::new(1, ends.mr.sge(32, 32).unwrap()))
        .unwrap();
    ends.mr.write(0, message).unwrap();
    ends.conn
        .post_send(SendWr::send(2, ends.mr.sge(0, message.len()).unwrap()))
        .unwrap();
    let mut received = None;
    for _ in 0..2 {
        let wc = ends.cq.wait(WAIT).unwrap().expect("a completion");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        if wc.wr_id == 1 {
            received = Some(wc.byte_len as usize);
        }
    }
    let mut echoed = vec![0; received.expect("the echo")];
    ends.mr.read(32, &mut echoed).unwrap();
    echoed
}

/// Serves one connection on `listener`: echoes each SEND until the peer disconnects.
fn serve(device: &Device, listener: &Listener, said: impl Fn(String)) {
    let request = listener.next_request(WAIT).unwrap().expect("a request");
    let pd = device.alloc_pd().unwrap();
    let cq = device.create_cq(8).unwrap();
    let mr = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
    // The first receive before the accept: the client may SEND at once.
    qp.init(Access::LOCAL_WRITE).unwrap();
    qp.post_recv(RecvWr::new(1, mr.sge(0, 32).unwrap()))
        .unwrap();
    let conn = request.accept(qp, &ConnectOptions::default(), &[]).unwrap();
    said(format!("accepted qpn={}", conn.qpn().value()));
    loop {
        let Some(wc) = cq.wait(Duration::from_millis(100)).unwrap() else {
            if conn.is_connected() {
                continue;
            }
            return;
        };
        if wc.status != WcStatus::Success {
            return;
        }
        if wc.wr_id == 1 {
            let len = wc.byte_len as usize;
            let mut got = vec![0; len];
            mr.read(0, &mut got).unwrap();
            mr.write(32, &got).unwrap();
            conn.post_recv(RecvWr::new(1, mr.sge(0, 32).unwrap()))
                .unwrap();
            conn.post_send(SendWr::send(2, mr.sge(32, len).unwrap()))
                .unwrap();
        }
    }
}

/// A child's work, by `SHARED_ADDRESS_CHILD`: `serve ADDR PORT` (listen, echo one connection),
/// `hold ADDR PORT` (listen, accept, then wait to be killed), `take ADDR PORT QPS` (listen,
/// make QPS QPs and say their numbers, then say its drops when told), `answer ADDR PORT` (a UD
/// service: answer one SIDR request), `resolve ADDR TO` (resolve a UD service), `refused ADDR
/// TO` (connect where nobody listens), `open ADDR` (say how the open went).
#[test]
#[ignore = "a child process's entry point: the tests below run it"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let words: Vec<&str> = role.split_whitespace().collect();
    let say = |what: String| println!("child: {what}");
    match words.as_slice() {
        ["serve", addr, port] | ["hold", addr, port] => {
            let device = device(addr);
            let listener = device.listen(port.parse().unwrap()).unwrap();
            say(format!("listening place={}", device.place().unwrap()));
            if words[0] == "serve" {
                serve(&device, &listener, say);
            } else {
                let request = listener.next_request(WAIT).unwrap().expect("a request");
                let pd = device.alloc_pd().unwrap();
                let cq = device.create_cq(8).unwrap();
                let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
                let conn = request.accept(qp, &ConnectOptions::default(), &[]).unwrap();
                say(format!("accepted qpn={}", conn.qpn().value()));
                std::thread::sleep(Duration::from_secs(600));
            }
        }
        ["take", addr, port, qps] => {
            let device = device(addr);
            let _listener = device.listen(port.parse().unwrap()).unwrap();
            let pd = device.alloc_pd().unwrap();
            let cq = device.create_cq(8).unwrap();
            let qps: Vec<QueuePair> = (0..qps.parse::<usize>().unwrap())
                .map(|_| pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap())
                .collect();
            let numbers: Vec<String> = qps.iter().map(|qp| qp.qpn().value().to_string()).collect();
            say(format!(
                "listening place={} qpns={}",
                device.place().unwrap(),
                numbers.join(",")
            ));
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
            let (counters, _) = device.counters().unwrap();
            say(format!(
                "dropped_unknown_qp={}",
                counters.dropped_unknown_qp
            ));
        }
        ["answer", addr, port] => {
            // A UD service, resolved by SIDR: one request answered with its QP.
            let device = device(addr);
            let (pd, cq) = (device.alloc_pd().unwrap(), device.create_cq(4).unwrap());
            let qp = pd
                .create_qp()
                .qp_type(QpType::Ud)
                .qkey(softroce::cm::RDMA_UDP_QKEY)
                .send_cq(&cq)
                .recv_cq(&cq)
                .build()
                .unwrap();
            qp.ready_datagram().unwrap();
            let listener = device.listen_datagram(port.parse().unwrap()).unwrap();
            say(format!(
                "listening place={} qpn={}",
                device.place().unwrap(),
                qp.qpn().value()
            ));
            let request = listener.next_request(WAIT).unwrap().expect("a request");
            request.reply(&qp, &[]).unwrap();
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
        }
        ["resolve", addr, to] => {
            let device = device(addr);
            let peer = device.resolve_datagram(to.parse().unwrap(), &[]).unwrap();
            say(format!("resolved qpn={}", peer.qpn.value()));
        }
        ["refused", addr, to] => {
            let device = device(addr);
            let (pd, cq) = (device.alloc_pd().unwrap(), device.create_cq(4).unwrap());
            let qp = pd.create_qp().send_cq(&cq).recv_cq(&cq).build().unwrap();
            let to = to.parse().unwrap();
            match Connection::connect(qp, to, &ConnectOptions::default(), &[]) {
                Err(Error::ConnectFailed { failure, .. }) => say(format!("refused: {failure:?}")),
                other => say(format!("not refused: {other:?}")),
            }
        }
        ["open", addr] => match Device::open(DeviceConfig::udp(addr.parse().unwrap())) {
            Ok(device) => say(format!("opened place={:?}", device.place())),
            Err(error) => say(format!("refused: {error}")),
        },
        _ => panic!("unknown role {role:?}"),
    }
}

/// Three processes and this one serve on one address at once, each on its own RDMA-CM port,
/// each with a place of its own; a port another process holds is refused, as the kernel's
/// `rdma_bind_addr` refuses it; a client on another address reaches each.
#[test]
fn processes_share_an_address_each_with_its_own_ports_and_qps() {
    let (server_addr, client_addr) = ("127.0.8.20", "127.0.8.21");
    let mut children: Vec<Process> = (0..3)
        .map(|i| Process::start(&format!("serve {server_addr} {}", 7301 + i)))
        .collect();
    let mut places: Vec<u64> = children
        .iter_mut()
        .map(|child| value_of(&child.said(), "place"))
        .collect();
    let here = device(server_addr);
    places.push(u64::from(
        here.place().expect("a place in the address's group"),
    ));
    let mut distinct = places.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), places.len(), "places {places:?}");
    let taken = here
        .listen(7302)
        .expect_err("another process holds port 7302");
    assert!(
        matches!(&taken, Error::Io(e) if e.kind() == std::io::ErrorKind::AddrInUse),
        "{taken}"
    );
    let listener = here.listen(7304).unwrap();
    let served = std::thread::spawn(move || serve(&here, &listener, drop));
    let client = device(client_addr);
    // All four at once: REQs to processes of one address leave one device in one turn, each
    // alone (a MAD never rides in a segmentation train, which the kernel steers whole).
    let connecting: Vec<_> = (7301..=7304)
        .map(|port| {
            let client = client.clone();
            std::thread::spawn(move || {
                let to = format!("{server_addr}:{port}").parse().unwrap();
                let ends = connect(&client, to);
                let message = format!("hello {port}");
                assert_eq!(echo(&ends, message.as_bytes()), message.as_bytes());
                ends.conn.disconnect().unwrap();
            })
        })
        .collect();
    for thread in connecting {
        thread.join().unwrap();
    }
    for mut child in children.drain(..) {
        assert!(child.said().starts_with("accepted"));
        child.wait_success();
    }
    served.join().unwrap();
    let (counters, _) = client.counters().unwrap();
    assert_eq!(counters.dropped_unknown_qp, 0);
}

/// A process killed mid-connection: the others keep serving; its RDMA-CM port and its place
/// are free at once for a new process, which never draws a QP number the killed one held, so
/// the packets still coming for the killed one's QP are dropped and counted there.
#[test]
fn a_killed_process_frees_its_port_and_place_and_its_packets_find_no_qp() {
    let (server_addr, client_addr) = ("127.0.8.22", "127.0.8.23");
    let mut killed = Process::start(&format!("hold {server_addr} 7311"));
    let killed_place = value_of(&killed.said(), "place");
    let mut survivor = Process::start(&format!("serve {server_addr} 7312"));
    survivor.said();
    let client = device(client_addr);
    let held = connect(&client, format!("{server_addr}:7311").parse().unwrap());
    let killed_qpn = value_of(&killed.said(), "qpn");
    assert_eq!(
        killed_qpn & 0xff,
        killed_place,
        "a QP number ends in its place"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(killed.child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = killed.child.wait();
    // The port and the place go to the next process at once.
    let mut taker = Process::start(&format!("take {server_addr} 7311 500"));
    let said = taker.said();
    assert_eq!(value_of(&said, "place"), killed_place, "{said}");
    let numbers = said.split("qpns=").nth(1).unwrap();
    assert!(
        numbers
            .split(',')
            .all(|n| n.parse::<u64>().unwrap() != killed_qpn),
        "the new process drew the killed one's QP number {killed_qpn:#x}"
    );
    // A SEND on the connection to the killed process reaches the new one, which has no QP for
    // it: it never completes well.
    held.mr.write(0, b"to the dead").unwrap();
    held.conn
        .post_send(SendWr::send(9, held.mr.sge(0, 11).unwrap()))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    taker.tell("counters?");
    let drops = value_of(&taker.said(), "dropped_unknown_qp");
    assert!(
        drops > 0,
        "the packets for the killed process's QP were not counted"
    );
    taker.wait_success();
    // The survivor lost nothing.
    let ends = connect(&client, format!("{server_addr}:7312").parse().unwrap());
    assert_eq!(echo(&ends, b"still here"), b"still here");
    ends.conn.disconnect().unwrap();
    assert!(survivor.said().starts_with("accepted"));
    survivor.wait_success();
}

/// UD service resolution across processes: SIDR_REQs from processes of one address reach the
/// processes of another that listen on their ports, and each SIDR_REP its own requester (by
/// its request ID); REJs for a port nobody listens on reach each connecting process (by its
/// communication ID).
#[test]
fn sidr_and_rejections_reach_their_processes() {
    let (server_addr, client_addr) = ("127.0.8.26", "127.0.8.27");
    let mut servers: Vec<Process> = [7321, 7322]
        .iter()
        .map(|port| Process::start(&format!("answer {server_addr} {port}")))
        .collect();
    let qpns: Vec<u64> = servers
        .iter_mut()
        .map(|server| value_of(&server.said(), "qpn"))
        .collect();
    // All at once, four processes on one address.
    let mut clients: Vec<Process> = [7321, 7322]
        .iter()
        .map(|port| Process::start(&format!("resolve {client_addr} {server_addr}:{port}")))
        .chain((0..2).map(|_| Process::start(&format!("refused {client_addr} {server_addr}:7399"))))
        .collect();
    for (client, qpn) in clients.iter_mut().zip(&qpns) {
        assert_eq!(value_of(&client.said(), "qpn"), *qpn);
    }
    for client in &mut clients[2..] {
        let said = client.said();
        assert!(said.starts_with("refused: Rejected"), "{said}");
    }
    for client in clients {
        client.wait_success();
    }
    for mut server in servers {
        server.tell("done");
        server.wait_success();
    }
}

/// A process of another user cannot join the address's group (the kernel admits one user to a
/// reuse-port group): it is told so, and what to do.
#[test]
#[ignore = "needs root: runs a process as another user"]
fn another_user_is_told_the_address_is_taken_and_what_to_do() {
    let addr = "127.0.8.24";
    let _here = device(addr);
    let mut other = Process::start_as(&format!("open {addr}"), Some("65534"));
    let said = other.said();
    assert!(said.starts_with("refused"), "{said}");
    assert!(said.contains("another user"), "{said}");
    assert!(said.contains("another address"), "{said}");
    other.wait_success();
    // As this user, the same open joins.
    let mut same = Process::start(&format!("open {addr}"));
    assert!(same.said().starts_with("opened place=Some"));
    same.wait_success();
}
