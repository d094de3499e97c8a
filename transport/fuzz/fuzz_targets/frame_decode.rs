//! Fuzzes the frame decoder: any bytes give a frame or a typed error, never a panic,
//! and whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shingle_transport::frame::{FrameError, decode_frame};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the payload bound so that the TooLarge path is reached too.
    let (max, bytes) = match data.split_first() {
        Some((m, rest)) => (u32::from(*m) * 64, rest),
        None => (0, data),
    };
    match decode_frame(bytes, max) {
        Ok((frame, used)) => {
            assert!(used <= bytes.len());
            assert_eq!(frame.header.payload_len as usize, frame.payload.len());
            assert!(frame.payload.len() as u32 <= max);
            let again = frame.encode().expect("a decoded frame re-encodes");
            assert_eq!(&again[..], &bytes[..used], "decode/encode is not the identity");
        }
        Err(FrameError::Incomplete { needed }) => assert!(needed > 0),
        Err(_) => {}
    }
});
