//! CM MADs in a capture: what `softroce decode` shows of a UD packet to QP1 (IBTA chapter 12;
//! Wireshark's `infiniband_cm_*` fields): the message, its transaction and communication IDs,
//! the service ID with RDMA-CM's port space and port, the negotiated QP values, a REJ's reason
//! and a SIDR_REP's status, RDMA-CM's IP header, and how many bytes of private data follow it.

use serde::Serialize;

use crate::wire::cm::{CmMessage, CmaHeader, CmaHeaderRepr, ServiceId, CMA_HEADER_LEN};

/// RDMA-CM's IP header (`struct cma_hdr`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CmaJson {
    /// The active side's IP address.
    pub src: String,
    /// The active side's source port.
    pub src_port: u16,
    /// The passive side's IP address; its port is the service ID's.
    pub dst: String,
}

/// One CM MAD.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct CmJson {
    /// `REQ`, `REP`, ... `SIDR_REP`, or the attribute's name for the others.
    pub message: &'static str,
    /// The MAD header's transaction ID.
    pub tid: u64,
    /// The sender's Local Communication ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_comm_id: Option<u32>,
    /// The Remote Communication ID: the peer's Local Communication ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_comm_id: Option<u32>,
    /// A SIDR request's ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u32>,
    /// The Service ID of a REQ, SIDR_REQ or SIDR_REP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_id: Option<u64>,
    /// RDMA-CM's port space (`TCP`, `UDP`, `IB`) and port, from an IP service ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_space: Option<&'static str>,
    /// RDMA-CM's port, from an IP service ID (see `port_space`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The sender's QPN (a REQ's or REP's), a DREQ's remote QPN, a SIDR_REP's answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qpn: Option<u32>,
    /// A REQ's or REP's starting PSN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starting_psn: Option<u32>,
    /// A REQ's path MTU, in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_mtu: Option<usize>,
    /// A REJ's reason code (IBTA table 112).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<u16>,
    /// The name of `reason`, e.g. `consumer defined`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_name: Option<&'static str>,
    /// A SIDR_REP's status (IBTA table 121).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u8>,
    /// The name of `status`, e.g. `success`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_name: Option<&'static str>,
    /// A SIDR_REP's Q_Key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qkey: Option<u32>,
    /// RDMA-CM's IP header at the start of a REQ's or SIDR_REQ's private data, where the
    /// service ID is an IP one and the header parses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<CmaJson>,
    /// The bytes of private data the message has room for, after RDMA-CM's header if any.
    pub private_data_len: usize,
}

/// RDMA-CM's header at the start of `private`, for an IP service ID; with how much follows.
fn ip_header(service_id: ServiceId, private: &[u8]) -> (Option<CmaJson>, usize) {
    if service_id.ip_port().is_none() {
        return (None, private.len());
    }
    let header = CmaHeader::new_checked(private).and_then(|h| CmaHeaderRepr::parse(&h));
    match header {
        Ok(h) => (
            Some(CmaJson {
                src: h.src.to_string(),
                src_port: h.src_port,
                dst: h.dst.to_string(),
            }),
            private.len() - CMA_HEADER_LEN,
        ),
        Err(_) => (None, private.len()),
    }
}

/// The CM MAD a QP1 payload holds, if it holds one.
pub fn decode(mad: &[u8]) -> Option<CmJson> {
    let (header, message) = CmMessage::parse(mad).ok()?;
    let mut cm = CmJson {
        message: message.name(),
        tid: header.tid,
        ..CmJson::default()
    };
    let service = |cm: &mut CmJson, id: ServiceId| {
        cm.service_id = Some(id.0);
        if let Some((space, port)) = id.ip_port() {
            cm.port_space = Some(space.name());
            cm.port = Some(port);
        }
    };
    match &message {
        CmMessage::Req(m) => {
            (cm.local_comm_id, cm.qpn) = (Some(m.local_comm_id), Some(m.local_qpn.value()));
            cm.starting_psn = Some(m.starting_psn.value());
            cm.path_mtu = crate::transport::PathMtu::from_ibv_enum(m.path_mtu).map(|m| m.bytes());
            service(&mut cm, m.service_id);
            (cm.ip, cm.private_data_len) = ip_header(m.service_id, &m.private_data);
        }
        CmMessage::Rep(m) => {
            cm.local_comm_id = Some(m.local_comm_id);
            cm.remote_comm_id = Some(m.remote_comm_id);
            (cm.qpn, cm.starting_psn) = (Some(m.local_qpn.value()), Some(m.starting_psn.value()));
            cm.private_data_len = m.private_data.len();
        }
        CmMessage::Rej(m) => {
            cm.local_comm_id = Some(m.local_comm_id);
            cm.remote_comm_id = Some(m.remote_comm_id);
            (cm.reason, cm.reason_name) = (Some(m.reason.0), Some(m.reason.name()));
            cm.private_data_len = m.private_data.len();
        }
        CmMessage::Mra(m) => {
            cm.local_comm_id = Some(m.local_comm_id);
            cm.remote_comm_id = Some(m.remote_comm_id);
            cm.private_data_len = m.private_data.len();
        }
        CmMessage::Rtu(m) => {
            cm.local_comm_id = Some(m.local_comm_id);
            cm.remote_comm_id = Some(m.remote_comm_id);
            cm.private_data_len = m.private_data.len();
        }
        CmMessage::Dreq(m) => {
            cm.local_comm_id = Some(m.local_comm_id);
            cm.remote_comm_id = Some(m.remote_comm_id);
            cm.qpn = Some(m.remote_qpn.value());
            cm.private_data_len = m.private_data.len();
        }
        CmMessage::Drep(m) => {
            cm.local_comm_id = Some(m.local_comm_id);
            cm.remote_comm_id = Some(m.remote_comm_id);
            cm.private_data_len = m.private_data.len();
        }
        CmMessage::SidrReq(m) => {
            cm.request_id = Some(m.request_id);
            service(&mut cm, m.service_id);
            (cm.ip, cm.private_data_len) = ip_header(m.service_id, &m.private_data);
        }
        CmMessage::SidrRep(m) => {
            cm.request_id = Some(m.request_id);
            (cm.status, cm.status_name) = (Some(m.status.0), Some(m.status.name()));
            (cm.qpn, cm.qkey) = (Some(m.qpn.value()), Some(m.qkey.0));
            service(&mut cm, m.service_id);
            cm.private_data_len = m.private_data.len();
        }
        CmMessage::Other { .. } => {}
    }
    Some(cm)
}

impl CmJson {
    /// The text form, after the packet's own summary.
    pub fn summary(&self) -> String {
        let mut parts = vec![
            format!("CM {}", self.message),
            format!("tid={:#018x}", self.tid),
        ];
        let hex = |name: &str, v: Option<u32>| v.map(|v| format!("{name}={v:#010x}"));
        parts.extend(hex("local_comm", self.local_comm_id));
        parts.extend(hex("remote_comm", self.remote_comm_id));
        parts.extend(hex("request", self.request_id));
        parts.extend(self.service_id.map(|s| format!("service={s:#018x}")));
        if let (Some(space), Some(port)) = (self.port_space, self.port) {
            parts.push(format!("({space} port {port})"));
        }
        parts.extend(self.qpn.map(|q| format!("qpn={q:#08x}")));
        parts.extend(self.starting_psn.map(|p| format!("psn={p}")));
        parts.extend(self.path_mtu.map(|m| format!("mtu={m}")));
        parts.extend(hex("qkey", self.qkey));
        if let (Some(reason), Some(name)) = (self.reason, self.reason_name) {
            parts.push(format!("reason={reason} ({name})"));
        }
        if let (Some(status), Some(name)) = (self.status, self.status_name) {
            parts.push(format!("status={status} ({name})"));
        }
        if let Some(ip) = &self.ip {
            parts.push(format!("ip {} port {} -> {}", ip.src, ip.src_port, ip.dst));
        }
        parts.push(format!("private={}", self.private_data_len));
        format!(" {}", parts.join(" "))
    }
}
