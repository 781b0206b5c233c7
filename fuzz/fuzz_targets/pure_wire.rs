//! Pure's frame parser (`transport_pure::wire`) on arbitrary datagrams.
//!
//! Checks, for every datagram: walking it never panics; every frame it accepts is exactly the bytes the encoders
//! (`put_record_header`, `put_answer_header`) write for the fields it reports, so parse and encode agree; a sealed
//! body holds at least the time and a tag, a plain body at least the time; frames tile the datagram from its start,
//! and the walk stops at the first malformed frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transport_pure::wire::{self, Frame, Kind, MADE_LEN, TAG_LEN};

fuzz_target!(init: transport_fuzz::seeds::write_if_asked("pure_wire"), |data: &[u8]| {
    let mut at = 0;
    let mut walk = wire::frames(data);
    loop {
        let expected = (at < data.len()).then(|| wire::parse_frame(&data[at..]));
        let got = walk.next();
        assert_eq!(got, expected.map(|r| r.map(|(f, _)| f)), "frames() and parse_frame() disagree at {at}");
        let Some(Ok((frame, used))) = (at < data.len()).then(|| wire::parse_frame(&data[at..])) else {
            assert_eq!(walk.next(), None, "the walk goes on after an error");
            break;
        };
        let bytes = &data[at..at + used];
        assert_eq!(reencode(&frame), bytes, "frame at {at} does not encode back to its bytes");
        at += used;
    }
});

/// The bytes the encoders write for `frame`, with checks of the lengths it reports.
fn reencode(frame: &Frame<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    match frame {
        Frame::Record(r) => {
            assert_eq!(r.variant.len(), r.kind.variant_len());
            assert_eq!(r.header.len(), r.kind.record_header_len());
            let min = if r.kind.sealed() {
                MADE_LEN + TAG_LEN
            } else {
                MADE_LEN
            };
            assert!(
                r.body.len() >= min,
                "a {:?} body of {} bytes was accepted",
                r.kind,
                r.body.len()
            );
            match r.kind {
                Kind::HpkeSession | Kind::HpkePerRequest => {
                    assert_eq!(r.enc().map(|e| &e[..]), Some(r.variant))
                }
                Kind::Link => assert_eq!(
                    r.receiver_run()
                        .map(u64::to_be_bytes)
                        .as_ref()
                        .map(|b| &b[..]),
                    Some(r.variant)
                ),
                Kind::Plain => assert!(r.enc().is_none() && r.receiver_run().is_none()),
            }
            let header = wire::put_record_header(
                &mut out,
                r.kind,
                &r.key_id,
                r.run,
                r.seq,
                r.variant,
                r.body.len(),
            );
            assert_eq!(&out[header], r.header);
            out.extend_from_slice(r.body);
        }
        Frame::Answer(a) => {
            assert_eq!(a.tag.len(), if a.kind.sealed() { TAG_LEN } else { 0 });
            let header =
                wire::put_answer_header(&mut out, a.kind, &a.key_id, a.run, a.seq, a.receiver_run);
            assert_eq!(&out[header], a.header);
            out.extend_from_slice(a.tag);
            assert_eq!(out.len(), a.kind.answer_len());
        }
    }
    out
}
