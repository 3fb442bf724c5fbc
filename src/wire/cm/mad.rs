//! The common MAD header (IBTA 13.4.3), 24 bytes at the start of every 256-byte management
//! datagram, as communication management uses it.
//!
//! ```text
//!  0       base version (1)
//!  1       management class (0x07: communication management)
//!  2       class version (2 for CM)
//!  3       method (R bit and method; CM sends everything with 0x03, Send)
//!  4..6    status
//!  6..8    class specific
//!  8..16   transaction ID
//! 16..18   attribute ID: which CM message
//! 18..20   reserved
//! 20..24   attribute modifier
//! ```

use super::super::field::{set_u16, set_u32, set_u64, u16_at, u32_at, u64_at};
use super::super::{Error, Layer, Result};

mod field {
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: usize = 4;
    pub const CLASS_SPECIFIC: usize = 6;
    pub const TID: usize = 8;
    pub const ATTR_ID: usize = 16;
    pub const RESERVED: usize = 18;
    pub const ATTR_MOD: usize = 20;
}

/// The only MAD base version there is.
pub const BASE_VERSION: u8 = 1;
/// Communication management's management class.
pub const CM_CLASS: u8 = 0x07;
/// The CM class version the kernel and rdma-core speak.
pub const CM_CLASS_VERSION: u8 = 2;
/// Send: every CM message travels with this method; the attribute says what it is.
pub const METHOD_SEND: u8 = 0x03;

header_view!(
    /// A view of a MAD header.
    MadHeader,
    MadHeaderRepr,
    Layer::Mad,
    24
);

impl<T: AsRef<[u8]>> MadHeader<T> {
    /// BaseVersion (byte 0): 1 for every MAD.
    pub fn base_version(&self) -> u8 {
        self.bytes()[field::BASE_VERSION]
    }

    /// MgmtClass (byte 1): 0x07 for communication management.
    pub fn mgmt_class(&self) -> u8 {
        self.bytes()[field::MGMT_CLASS]
    }

    /// ClassVersion (byte 2): 2 for the CM the kernel speaks.
    pub fn class_version(&self) -> u8 {
        self.bytes()[field::CLASS_VERSION]
    }

    /// The R bit and Method (byte 3): 0x03, Send, for every CM message.
    pub fn method(&self) -> u8 {
        self.bytes()[field::METHOD]
    }

    /// Status (bytes 4 and 5).
    pub fn status(&self) -> u16 {
        u16_at(self.bytes(), field::STATUS)
    }

    /// ClassSpecific (bytes 6 and 7).
    pub fn class_specific(&self) -> u16 {
        u16_at(self.bytes(), field::CLASS_SPECIFIC)
    }

    /// TransactionID (bytes 8 to 15): pairs a reply with its request.
    pub fn tid(&self) -> u64 {
        u64_at(self.bytes(), field::TID)
    }

    /// AttributeID (bytes 16 and 17): which CM message follows; see [`attr`](super::attr).
    pub fn attr_id(&self) -> u16 {
        u16_at(self.bytes(), field::ATTR_ID)
    }

    /// AttributeModifier (bytes 20 to 23).
    pub fn attr_mod(&self) -> u32 {
        u32_at(self.bytes(), field::ATTR_MOD)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MadHeader<T> {
    fn set(&mut self, repr: &MadHeaderRepr) {
        let b = self.bytes_mut();
        b[field::BASE_VERSION] = repr.base_version;
        b[field::MGMT_CLASS] = repr.mgmt_class;
        b[field::CLASS_VERSION] = repr.class_version;
        b[field::METHOD] = repr.method;
        set_u16(b, field::STATUS, repr.status);
        set_u16(b, field::CLASS_SPECIFIC, repr.class_specific);
        set_u64(b, field::TID, repr.tid);
        set_u16(b, field::ATTR_ID, repr.attr_id);
        set_u16(b, field::RESERVED, 0);
        set_u32(b, field::ATTR_MOD, repr.attr_mod);
    }
}

/// The fields of a MAD header. The reserved field is sent as zero and not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeaderRepr {
    /// BaseVersion: 1.
    pub base_version: u8,
    /// MgmtClass: 0x07 for CM.
    pub mgmt_class: u8,
    /// ClassVersion: 2 for CM.
    pub class_version: u8,
    /// The R bit and Method; CM sends 0x03, Send.
    pub method: u8,
    /// Status; CM sends 0.
    pub status: u16,
    /// ClassSpecific; CM sends 0.
    pub class_specific: u16,
    /// TransactionID, which replies echo.
    pub tid: u64,
    /// AttributeID: which CM message the MAD carries.
    pub attr_id: u16,
    /// AttributeModifier.
    pub attr_mod: u32,
}

impl MadHeaderRepr {
    /// The header of a CM message `attr_id` in transaction `tid`.
    pub const fn cm(tid: u64, attr_id: u16) -> Self {
        MadHeaderRepr {
            base_version: BASE_VERSION,
            mgmt_class: CM_CLASS,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    /// Reads the fields out of a checked view, without [`check_cm`](Self::check_cm)'s checks.
    pub fn parse<T: AsRef<[u8]>>(mad: &MadHeader<T>) -> Result<Self> {
        Ok(MadHeaderRepr {
            base_version: mad.base_version(),
            mgmt_class: mad.mgmt_class(),
            class_version: mad.class_version(),
            method: mad.method(),
            status: mad.status(),
            class_specific: mad.class_specific(),
            tid: mad.tid(),
            attr_id: mad.attr_id(),
            attr_mod: mad.attr_mod(),
        })
    }

    /// Writes the fields into a checked view, with the reserved field zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, mad: &mut MadHeader<T>) {
        mad.set(self);
    }

    /// Checks that the MAD is a CM message sent as CM sends them: base version 1, class 0x07,
    /// class version 2, method Send. Anything else is not for the CM.
    pub fn check_cm(&self) -> Result<()> {
        let expect = |field, found: u8, want: u8, expected| {
            if found == want {
                Ok(())
            } else {
                Err(Error::Field {
                    layer: Layer::Mad,
                    field,
                    found: found.into(),
                    expected,
                })
            }
        };
        expect("base_version", self.base_version, BASE_VERSION, "1")?;
        expect("mgmt_class", self.mgmt_class, CM_CLASS, "0x07 (CM)")?;
        expect("class_version", self.class_version, CM_CLASS_VERSION, "2")?;
        expect("method", self.method, METHOD_SEND, "0x03 (Send)")
    }
}
