//! Error replies: what a server sends instead of a normal response.
//!
//! A `Status` travels as the payload of a frame with the ERROR flag. Its `code` is a
//! transport-level class; services put their own error (for example an errno) in
//! `app_code` with `code = Code::Application`.

use prost::Message;

/// Status classes. Unknown values decode as [`Code::Unknown`] so that new codes from a
/// newer peer still produce an error, never a misinterpreted success.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Code {
    /// A code this build does not know.
    Unknown = 0,
    /// The server has no handler for the message kind.
    UnknownKind = 1,
    /// The request payload could not be decoded or is invalid.
    InvalidRequest = 2,
    /// The deadline passed before the server finished.
    DeadlineExceeded = 3,
    /// The server is shutting down and takes no new work.
    ShuttingDown = 4,
    /// The server refused the request to protect itself.
    Overloaded = 5,
    /// A bug or unexpected condition on the server.
    Internal = 6,
    /// Remote read: no region with that id.
    UnknownRegion = 7,
    /// Remote read: the region was revoked or re-registered since the key was issued.
    StaleGeneration = 8,
    /// Remote read: offset + length outside the region.
    OutOfBounds = 9,
    /// The sender's cluster map is older than the server's.
    StaleEpoch = 10,
    /// Answered by servers before decision 0034 when their NIC could not register a
    /// region for RDMA; no longer sent (kept so that the number is never reused).
    NotRegistrable = 11,
    /// The sender may no longer do this: its role passed to another node (a metadata
    /// coordinator whose partition has a new primary). Final for the sender.
    Fenced = 12,
    /// The caller's client key may not do this (a kind only the cluster's own nodes
    /// send, a write with a read-only key, or a key that was revoked). Final.
    PermissionDenied = 13,
    /// A service-defined error; see `app_code`.
    Application = 100,
}

impl Code {
    /// The code's name, as in metrics labels (`DeadlineExceeded`).
    pub fn name(self) -> &'static str {
        match self {
            Code::Unknown => "Unknown",
            Code::UnknownKind => "UnknownKind",
            Code::InvalidRequest => "InvalidRequest",
            Code::DeadlineExceeded => "DeadlineExceeded",
            Code::ShuttingDown => "ShuttingDown",
            Code::Overloaded => "Overloaded",
            Code::Internal => "Internal",
            Code::UnknownRegion => "UnknownRegion",
            Code::StaleGeneration => "StaleGeneration",
            Code::OutOfBounds => "OutOfBounds",
            Code::StaleEpoch => "StaleEpoch",
            Code::NotRegistrable => "NotRegistrable",
            Code::Fenced => "Fenced",
            Code::PermissionDenied => "PermissionDenied",
            Code::Application => "Application",
        }
    }

    /// Maps a wire value to a code.
    pub fn from_u32(v: u32) -> Code {
        match v {
            1 => Code::UnknownKind,
            2 => Code::InvalidRequest,
            3 => Code::DeadlineExceeded,
            4 => Code::ShuttingDown,
            5 => Code::Overloaded,
            6 => Code::Internal,
            7 => Code::UnknownRegion,
            8 => Code::StaleGeneration,
            9 => Code::OutOfBounds,
            10 => Code::StaleEpoch,
            11 => Code::NotRegistrable,
            12 => Code::Fenced,
            13 => Code::PermissionDenied,
            100 => Code::Application,
            _ => Code::Unknown,
        }
    }
}

/// An error reply.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}{}: {message}", if *.app_code != 0 { format!("({})", .app_code) } else { String::new() })]
pub struct Status {
    /// The class.
    pub code: Code,
    /// Service-defined detail (for example an errno) when `code` is `Application`.
    pub app_code: u32,
    /// Human-readable context, for logs.
    pub message: String,
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[derive(Clone, PartialEq, prost::Message)]
struct StatusWire {
    #[prost(uint32, tag = "1")]
    code: u32,
    #[prost(uint32, tag = "2")]
    app_code: u32,
    #[prost(string, tag = "3")]
    message: String,
}

/// Longest message kept in a status; longer ones are cut so an error reply stays small.
const MAX_MESSAGE_BYTES: usize = 1024;

impl Status {
    /// A status of class `code`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > MAX_MESSAGE_BYTES {
            let mut cut = MAX_MESSAGE_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        Status {
            code,
            app_code: 0,
            message,
        }
    }

    /// A service-defined error.
    pub fn application(app_code: u32, message: impl Into<String>) -> Self {
        Status {
            app_code,
            ..Status::new(Code::Application, message)
        }
    }

    /// Encodes for the wire.
    pub fn encode_to_vec(&self) -> Vec<u8> {
        StatusWire {
            code: self.code as u32,
            app_code: self.app_code,
            message: self.message.clone(),
        }
        .encode_to_vec()
    }

    /// Decodes from the wire; an undecodable payload becomes an `Unknown` status.
    pub fn decode(bytes: &[u8]) -> Status {
        match StatusWire::decode(bytes) {
            Ok(w) => Status {
                code: Code::from_u32(w.code),
                app_code: w.app_code,
                message: w.message,
            },
            Err(e) => Status::new(Code::Unknown, format!("undecodable error reply: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_unknown_codes() {
        let s = Status::application(2, "no such file");
        let back = Status::decode(&s.encode_to_vec());
        assert_eq!(back, s);
        let w = StatusWire {
            code: 4242,
            app_code: 0,
            message: "x".into(),
        }
        .encode_to_vec();
        assert_eq!(Status::decode(&w).code, Code::Unknown);
        assert_eq!(Status::decode(&[0xff, 0xff]).code, Code::Unknown);
    }

    #[test]
    fn long_messages_are_cut_on_char_boundary() {
        let s = Status::new(Code::Internal, "é".repeat(1000));
        assert!(s.message.len() <= MAX_MESSAGE_BYTES);
        assert!(s.message.chars().all(|c| c == 'é'));
    }
}
