//! The Rust API's exchange types and connection defaults: what two programs hand each other
//! out of band, and what `connect` picks when told nothing.

use softroce::prelude::*;

#[cfg(feature = "serde")]
fn endpoint() -> QpEndpoint {
    QpEndpoint {
        addr: "192.0.2.7".parse().unwrap(),
        qpn: Qpn::new(0x12_3456),
        psn: Psn::new(0xab_cdef),
        mtu: PathMtu::Mtu1024,
        qkey: QKey(0x1111_1111),
    }
}

#[cfg(feature = "serde")]
#[test]
fn exchange_types_round_trip_through_serde_and_refuse_what_does_not_fit() {
    let json = serde_json::to_string(&endpoint()).unwrap();
    assert_eq!(
        json,
        r#"{"addr":"192.0.2.7","qpn":1193046,"psn":11259375,"mtu":1024,"qkey":286331153}"#
    );
    assert_eq!(
        serde_json::from_str::<QpEndpoint>(&json).unwrap(),
        endpoint()
    );
    // A QPN of 25 bits and an MTU that is no IB MTU are refused, not truncated.
    let wide = json.replace("1193046", "16777216");
    assert!(serde_json::from_str::<QpEndpoint>(&wide).is_err());
    let odd = json.replace(r#""mtu":1024"#, r#""mtu":1500"#);
    assert!(serde_json::from_str::<QpEndpoint>(&odd).is_err());

    let region = RemoteRegion {
        addr: 0x7f00_0000_1000,
        len: 4096,
        rkey: RKey(0x42),
    };
    let json = serde_json::to_string(&region).unwrap();
    assert_eq!(json, r#"{"addr":139637976731648,"len":4096,"rkey":66}"#);
    assert_eq!(serde_json::from_str::<RemoteRegion>(&json).unwrap(), region);
}

/// librdmacm and perftest start each QP from a random PSN (`lrand48() & 0xffffff`), so that a
/// stale packet of an earlier connection seldom lands in the new one's window; softroce's
/// `connect` does the same unless the builder names a PSN.
#[test]
fn each_qp_sends_from_its_own_random_psn_unless_told() {
    let device = Device::open(DeviceConfig::udp("127.0.0.36".parse().unwrap())).unwrap();
    let pd = device.alloc_pd().unwrap();
    let cq = device.create_cq(4).unwrap();
    let build = || pd.create_qp().send_cq(&cq).recv_cq(&cq);
    let psns: Vec<Psn> = (0..4)
        .map(|_| build().build().unwrap().endpoint().psn)
        .collect();
    assert!(
        psns.windows(2).any(|w| w[0] != w[1]),
        "four QPs all started from {psns:?}"
    );
    let told = build().sq_psn(Psn::new(77)).build().unwrap().endpoint();
    assert_eq!(told.psn, Psn::new(77));
    assert_eq!(told.addr, device.address());
    assert_eq!(told.mtu, device.port_mtu(), "the port's MTU is offered");
}
