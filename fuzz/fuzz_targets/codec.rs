//! Feeds arbitrary bytes, in arbitrary chunk sizes, through the line framer and the message
//! decoder, checking the invariants hosts rely on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::{decode_message, encode_message, LineFramer};

fuzz_target!(|data: &[u8]| {
    let Some((&control, input)) = data.split_first() else {
        return;
    };
    let limit = 1 + usize::from(control & 0x3f);
    let chunk = 1 + usize::from(control >> 6) * 7;
    let mut framer = LineFramer::new(limit);
    let mut lines = Vec::new();
    for piece in input.chunks(chunk) {
        let mut rest = piece;
        while !rest.is_empty() {
            let (consumed, line) = framer.feed(rest);
            assert!(consumed > 0 && consumed <= rest.len());
            rest = &rest[consumed..];
            lines.extend(line);
        }
    }
    lines.extend(framer.finish());
    for line in lines.into_iter().flatten() {
        assert!(line.len() <= limit, "a line over the limit got through");
        assert!(!line.contains('\n'));
        match decode_message(&line) {
            Ok(message) => {
                // Whatever decodes re-encodes as one line that decodes to the same message.
                let bytes = encode_message(&message);
                let again = std::str::from_utf8(&bytes).unwrap().trim_end_matches('\n');
                assert!(!again.contains('\n'));
                assert_eq!(decode_message(again).unwrap(), message);
            }
            Err(response) => assert!(response.outcome.is_err()),
        }
    }
    // Whole-input decoding never panics either.
    if let Ok(text) = std::str::from_utf8(input) {
        let _ = decode_message(text);
    }
});
