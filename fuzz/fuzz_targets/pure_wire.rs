//! Pure's frame parser (`transport_pure::wire`) on arbitrary datagrams: records of every op (orders, subscribes,
//! publishes, deliveries, bundles of orders) and answers (answer bundles too), of every variant.
//!
//! Checks, for every datagram:
//! - walking it never panics, and `frames()` agrees with `parse_frame()` frame by frame;
//! - every frame's verdict (its length, or its error) is the one a reference reader written from the format in the
//!   module doc of `wire.rs` gives: the kind byte's answer bit, op, refused bit and variant, each op's variant header
//!   and fixed fields, the tag of sealed variants, which ops are answered, and that only an answer to a subscribe can
//!   be a refusal;
//! - every accepted frame is exactly the bytes the encoders (`put_record_header`, `put_answer_header`,
//!   `put_refusal_header`) write for the fields it reports, so parse and encode agree; the variant header, enc and receiver run are where the format
//!   puts them;
//! - frames tile the datagram from its start, and the walk stops at the first malformed frame;
//! - a plain bundle's orders (its plaintext is readable) walk as the reference reads them, and encode back to their
//!   bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transport_pure::wire::{self, Frame, Kind, Op, WireError};

fuzz_target!(init: transport_fuzz::seeds::write_if_asked("pure_wire"), |data: &[u8]| {
    let mut at = 0;
    let mut walk = wire::frames(data);
    loop {
        let parsed = (at < data.len()).then(|| wire::parse_frame(&data[at..]));
        let got = walk.next();
        assert_eq!(got, parsed.map(|r| r.map(|(f, _)| f)), "frames() and parse_frame() disagree at {at}");
        let Some(parsed) = parsed else { break };
        assert_eq!(
            parsed.map(|(_, used)| used),
            reference(&data[at..]),
            "the parser and the format's reference reader disagree at {at}"
        );
        let Ok((frame, used)) = parsed else {
            assert_eq!(walk.next(), None, "the walk goes on after an error");
            break;
        };
        let bytes = &data[at..at + used];
        assert_eq!(reencode(&frame), bytes, "frame at {at} does not encode back to its bytes");
        at += used;
    }
});

/// The length of the frame at the start of `buf`, or why it is refused, read from the format as the module doc of
/// `wire.rs` writes it (numbers from the doc, not from the parser's constants).
fn reference(buf: &[u8]) -> Result<usize, WireError> {
    // version, kind, key id [8], run u64, number u64
    const COMMON: usize = 1 + 1 + 8 + 8 + 8;
    if buf.len() < COMMON {
        return Err(WireError::Truncated);
    }
    if buf[0] != 1 {
        return Err(WireError::Version(buf[0]));
    }
    let kind = buf[1];
    // answer (bit 7) | op (bits 4-6) | refused (bit 3) | variant (bits 0-2)
    let (answer, op, refused, variant) = (
        kind & 0x80 != 0,
        (kind >> 4) & 0x07,
        kind & 0x08 != 0,
        kind & 0x07,
    );
    // Op 6, a bundle of orders (and its answer bundle), is no variant's but hpke-per-request's.
    if !(1..=4).contains(&variant) || op > 6 || (op == 6 && variant == 3) {
        return Err(WireError::Kind(kind));
    }
    // Only the answer to a subscribe can say it was refused.
    if refused && !(answer && op == 1) {
        return Err(WireError::Kind(kind));
    }
    let sealed = variant != 1;
    let tag = if sealed { 16 } else { 0 };
    if answer && op == 6 {
        // The answer header, then count u16, count seqs u64 and the tag; at least one seq.
        let head = COMMON + 8 + 2;
        if buf.len() < head {
            return Err(WireError::Truncated);
        }
        let count = usize::from(u16::from_be_bytes([buf[COMMON + 8], buf[COMMON + 9]]));
        if count == 0 {
            return Err(WireError::ShortBody);
        }
        let len = head + 8 * count + tag;
        return if buf.len() < len {
            Err(WireError::Truncated)
        } else {
            Ok(len)
        };
    }
    if answer {
        // Only orders, subscribes, QoS 1 publishes and QoS 1 deliveries are answered.
        if !matches!(op, 0 | 1 | 2 | 4) {
            return Err(WireError::Kind(kind));
        }
        let len = COMMON + 8 + tag;
        return if buf.len() < len {
            Err(WireError::Truncated)
        } else {
            Ok(len)
        };
    }
    let variant_header = match (op, variant) {
        // Deliveries: the receiver run, and for hpke-per-request the enc of the delivery's own setup.
        (4 | 5, 3) => 8 + 32,
        (4 | 5, _) => 8,
        (_, 1) => 0,
        (_, 2 | 3) => 32,
        _ => 8,
    };
    let header = COMMON + variant_header + 2;
    if buf.len() < header {
        return Err(WireError::Truncated);
    }
    let body = usize::from(u16::from_be_bytes([buf[header - 2], buf[header - 1]]));
    // made_us; receiver run, channel, qos; receiver run, channel, id; channel, id; a bundle's first order's seq,
    // len and made_us.
    let fixed = [8, 8 + 4 + 1, 8 + 4 + 8, 8 + 4 + 8, 4 + 8, 4 + 8, 8 + 2 + 8][usize::from(op)];
    if body < fixed + tag {
        return Err(WireError::ShortBody);
    }
    if buf.len() < header + body {
        return Err(WireError::Truncated);
    }
    Ok(header + body)
}

/// The orders of a bundle's plaintext as the format reads them: (seq, plaintext) each, and whether the walk ended
/// at a malformed entry.
fn reference_entries(mut plain: &[u8]) -> (Vec<(u64, &[u8])>, bool) {
    let mut out = Vec::new();
    while !plain.is_empty() {
        // seq u64 | len u16 | made_us u64 | payload, len counting made_us and the payload.
        if plain.len() < 10 {
            return (out, true);
        }
        let len = usize::from(u16::from_be_bytes([plain[8], plain[9]]));
        if len < 8 || plain.len() < 10 + len {
            return (out, true);
        }
        out.push((u64::from_be_bytes(plain[..8].try_into().expect("8 bytes")), &plain[10..10 + len]));
        plain = &plain[10 + len..];
    }
    (out, false)
}

/// The bytes the encoders write for `frame`, with checks of the lengths and fields it reports.
fn reencode(frame: &Frame<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    match frame {
        Frame::Record(r) => {
            assert_eq!(r.variant.len(), r.kind.variant_len(r.op));
            assert_eq!(r.header.len(), r.kind.record_header_len(r.op));
            assert!(
                r.body.len() >= r.kind.min_body_len(r.op),
                "a {:?} {:?} body of {} bytes was accepted",
                r.kind,
                r.op,
                r.body.len()
            );
            let hpke = matches!(r.kind, Kind::HpkeSession | Kind::HpkePerRequest);
            let delivery = matches!(r.op, Op::Deliver1 | Op::Deliver0);
            // A delivery's variant header starts with the receiver run; a device's record of the link variant is
            // only the receiver run; an hpke record's enc follows the receiver run of a delivery.
            let enc_at = if delivery { 8 } else { 0 };
            let enc_expected = (hpke && (!delivery || r.kind == Kind::HpkePerRequest))
                .then(|| &r.variant[enc_at..enc_at + wire::ENC_LEN]);
            assert_eq!(
                r.enc().map(|e| &e[..]),
                enc_expected,
                "{:?} {:?} enc",
                r.kind,
                r.op
            );
            let run_expected = (delivery || r.kind == Kind::Link)
                .then(|| u64::from_be_bytes(r.variant[..8].try_into().expect("8 bytes")));
            assert_eq!(
                r.receiver_run(),
                run_expected,
                "{:?} {:?} receiver run",
                r.kind,
                r.op
            );
            if r.op == Op::Bundle && r.kind == Kind::Plain {
                let (expected, broken) = reference_entries(r.body);
                let walked: Vec<_> = wire::entries(r.body).collect();
                let good: Vec<(u64, &[u8])> =
                    walked.iter().filter_map(|e| e.ok()).map(|e| (e.seq, e.plain)).collect();
                assert_eq!(good, expected, "a bundle's orders");
                assert_eq!(walked.last().is_some_and(|e| e.is_err()), broken, "a bundle's malformed order");
                let mut again = Vec::new();
                for (seq, plain) in &good {
                    let made = u64::from_be_bytes(plain[..8].try_into().expect("8 bytes"));
                    wire::put_entry(&mut again, *seq, made, &plain[8..]);
                }
                assert!(r.body.starts_with(&again), "a bundle's orders encode back to their bytes");
            }
            let header = wire::put_record_header(
                &mut out,
                r.kind,
                r.op,
                &r.key_id,
                r.run,
                r.seq,
                r.variant,
                r.body.len(),
            );
            assert_eq!(&out[header], r.header);
            out.extend_from_slice(r.body);
            assert_eq!(
                out.len(),
                wire::record_len(r.kind, r.op, r.body.len() - r.kind.min_body_len(r.op))
            );
        }
        Frame::Answer(a) => {
            assert!(
                a.op.answered(),
                "an answer to {:?}, which is never answered",
                a.op
            );
            assert_eq!(a.tag.len(), if a.kind.sealed() { wire::TAG_LEN } else { 0 });
            let header = if a.refused {
                assert_eq!(a.op, Op::Subscribe, "a refusal of a {:?}", a.op);
                wire::put_refusal_header(&mut out, a.kind, &a.key_id, a.run, a.seq, a.receiver_run)
            } else {
                wire::put_answer_header(
                    &mut out,
                    a.kind,
                    a.op,
                    &a.key_id,
                    a.run,
                    a.seq,
                    a.receiver_run,
                )
            };
            assert_eq!(&out[header], a.header);
            out.extend_from_slice(a.tag);
            assert_eq!(out.len(), a.kind.answer_len());
        }
        Frame::AnswerBundle(b) => {
            assert!(b.kind.bundles(), "an answer bundle of {:?}", b.kind);
            assert!(!b.is_empty(), "an empty answer bundle was accepted");
            assert_eq!(b.tag.len(), if b.kind.sealed() { wire::TAG_LEN } else { 0 });
            wire::put_answer_bundle_header(
                &mut out,
                b.kind,
                &b.key_id,
                b.run,
                b.number,
                b.receiver_run,
                b.len(),
            );
            for seq in b.seqs() {
                out.extend_from_slice(&seq.to_be_bytes());
            }
            assert_eq!(&out[..], b.header);
            out.extend_from_slice(b.tag);
            assert_eq!(out.len(), wire::answer_bundle_len(b.kind, b.len()));
        }
    }
    out
}
