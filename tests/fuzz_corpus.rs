//! Replays every committed fuzz input (`fuzz/corpus/*/` and `fuzz/regressions/`) through the
//! checks of the `decode` fuzz target: no panic, and decoding each input whole or in chunks
//! through one resumable decoder gives the same frames and the same final outcome. The checks
//! live in `src/fuzzing.rs` (feature `fuzzing`), shared with the fuzz target.

use redlock_mux::fuzzing as common;

use std::fs;
use std::panic;
use std::path::{Path, PathBuf};

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_file() && path.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    files.sort();
    files
}

/// Runs the check on every file, reporting all failures (not just the first) by name.
fn replay(files: &[PathBuf]) {
    let failures: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let data = fs::read(path).expect("readable corpus file");
            panic::catch_unwind(|| common::check_decode(&data))
                .err()
                .map(|_| path.display().to_string())
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} inputs failed (panic messages above):\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

#[test]
fn corpus() {
    let mut files = Vec::new();
    for target in files_in_dirs(&fuzz_dir().join("corpus")) {
        files.extend(files_in(&target));
    }
    assert!(files.len() >= 50, "only {} corpus files", files.len());
    replay(&files);
}

fn files_in_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "no corpus directories in {}",
        dir.display()
    );
    dirs
}

#[test]
fn regressions() {
    let files = files_in(&fuzz_dir().join("regressions"));
    assert!(!files.is_empty(), "no regression inputs");
    replay(&files);
}

/// The shared input layout: a control byte picks the limits and chunking.
#[test]
fn input_layout() {
    let input = common::Input::parse(b"\x0b\x01\x04+OK\r\n");
    assert_eq!(input.limits, common::TINY);
    assert_eq!(input.chunks, [2, 5]);
    assert_eq!(input.wire, b"+OK\r\n");
    let input = common::Input::parse(b"");
    assert!(input.chunks.is_empty() && input.wire.is_empty());
    let (frames, end) = common::decode_chunked(b"+OK\r\n:1\r\n$-1", &common::SMALL, &[3]);
    assert_eq!(frames.len(), 2);
    assert_eq!(end, Ok(()));
}
