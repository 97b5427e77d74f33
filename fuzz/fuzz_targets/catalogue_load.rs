//! The catalogue loader never panics on any file: it reports located diagnostics instead.
#![no_main]

use std::path::PathBuf;

use fabric::catalogue::{load_from_texts, SourceFile};
use libfuzzer_sys::fuzz_target;

const PACK: &str = "host: You help.\n";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let files = [SourceFile { path: PathBuf::from("routes/fuzz.yaml"), text: text.to_owned() }];
    let packs = [SourceFile { path: PathBuf::from("packs/support.yaml"), text: PACK.to_owned() }];
    let catalogue = load_from_texts(&files, &packs);
    for d in catalogue.diagnostics() {
        assert!(d.to_string().starts_with("routes/fuzz.yaml:") || d.to_string().starts_with("packs/"));
    }
});
