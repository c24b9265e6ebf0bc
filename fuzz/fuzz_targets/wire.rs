//! Every decoder of the worker wire protocol: one payload under the frame type the
//! first byte names, and the whole input as a stream of frames (from a buffer and from
//! a reader, as a socket delivers it). A decoded message must encode back to a frame
//! that decodes to the same encoding.
#![no_main]
use hearth_parallel::wire::{decode_frame, read_frame, Message, DEFAULT_MAX_FRAME};
use libfuzzer_sys::fuzz_target;

fn round_trip(m: &Message) {
    let bytes = m.encode();
    let (again, n) = decode_frame(&bytes, usize::MAX).unwrap_or_else(|e| panic!("{} does not decode after encoding: {e}", m.name()));
    assert_eq!(n, bytes.len(), "{}: frame length", m.name());
    assert_eq!(again.encode(), bytes, "{}: encoding changed in a round trip", m.name());
    if let Message::Partial(p) = m {
        // What the allreduce does with a received piece (destination of its own size).
        let mut dst = vec![0f32; (p.n as usize).min(1 << 16)];
        let _ = p.add_into(&mut dst);
        let _ = p.decode_into(&mut dst);
    }
}

fuzz_target!(|data: &[u8]| {
    if let [ty, payload @ ..] = data {
        if let Ok(m) = Message::decode(*ty, payload) {
            round_trip(&m);
        }
    }
    let mut buf = data;
    while let Ok((m, n)) = decode_frame(buf, DEFAULT_MAX_FRAME) {
        round_trip(&m);
        buf = &buf[n..];
    }
    let mut r = data;
    while let Ok((m, _)) = read_frame(&mut r, DEFAULT_MAX_FRAME) {
        let _ = m.name();
    }
});
