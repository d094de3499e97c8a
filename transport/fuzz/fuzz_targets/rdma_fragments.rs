//! RDMA SEND fragments from a peer: split the input into fragments (first byte of each
//! chunk is its length), reassemble, and decode every completed message as a frame.
//! Any input: pieces or errors, never a panic, memory bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shingle_transport::fragment::{Piece, Reassembler};

fuzz_target!(|data: &[u8]| {
    let mut r = Reassembler::new(1 << 16, 8);
    let mut rest = data;
    while let Some((&n, tail)) = rest.split_first() {
        let n = (n as usize).min(tail.len());
        let (frag, more) = tail.split_at(n);
        rest = more;
        match r.push(frag) {
            Ok(Piece::Complete(_, msg)) => {
                let _ = shingle_transport::frame::decode_frame(&msg, 1 << 16);
            }
            Ok(_) => {}
            Err(_) => {
                r = Reassembler::new(1 << 16, 8);
            }
        }
        assert!(r.in_progress() <= 8);
    }
});
