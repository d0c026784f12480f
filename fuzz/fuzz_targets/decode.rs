//! Arbitrary bytes never panic the decoder, and decoding a stream whole or in arbitrary chunks
//! through one resumable `Decoder` gives the same frames and the same final outcome. The input
//! layout and every check are in the crate's `src/fuzzing.rs` (feature `fuzzing`, shared with
//! `tests/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use redlock_mux::fuzzing::check_decode;

fuzz_target!(|data: &[u8]| {
    check_decode(data);
});
