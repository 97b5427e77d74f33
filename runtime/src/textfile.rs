//! Reading text input with a bound: catalogue and pack files, stub scripts, the settings file,
//! prefetch packs, schemas and replies.
//!
//! Nothing is read past its limit plus one byte, and only regular files are opened: a symlink to
//! `/dev/zero` or a FIFO in a catalogue directory is refused before it can fill memory or block.

use std::io::Read;
use std::path::Path;

/// Why a text could not be read. The message names no path: callers put it in front.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("is not a regular file (a directory, device, FIFO or socket)")]
    NotAFile,
    #[error("is larger than the {limit}-byte limit")]
    TooLarge { limit: u64 },
    #[error("is not valid UTF-8 (at byte {at})")]
    NotUtf8 { at: usize },
    #[error("cannot be read: {0}")]
    Io(String),
}

/// Reads a regular file (symlinks followed) of at most `limit` bytes as UTF-8.
pub fn read_bounded(path: &Path, limit: u64) -> Result<String, ReadError> {
    let meta = std::fs::metadata(path).map_err(|e| ReadError::Io(e.to_string()))?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile);
    }
    if meta.len() > limit {
        return Err(ReadError::TooLarge { limit });
    }
    let file = std::fs::File::open(path).map_err(|e| ReadError::Io(e.to_string()))?;
    read_bounded_from(file, limit)
}

/// Reads at most `limit` bytes of UTF-8 from `input` (standard input, say); more is an error.
pub fn read_bounded_from(input: impl Read, limit: u64) -> Result<String, ReadError> {
    let mut bytes = Vec::new();
    // The file may grow after the size check (or be a pipe): never read past limit + 1.
    input.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| ReadError::Io(e.to_string()))?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge { limit });
    }
    String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8 { at: e.utf8_error().valid_up_to() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_and_large_files_are_refused() {
        assert_eq!(read_bounded(Path::new("/dev/zero"), 10), Err(ReadError::NotAFile));
        assert_eq!(read_bounded(Path::new("/"), 10), Err(ReadError::NotAFile));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.yaml");
        std::fs::write(&f, "0123456789A").unwrap();
        assert_eq!(read_bounded(&f, 10), Err(ReadError::TooLarge { limit: 10 }));
        assert_eq!(read_bounded(&f, 11).unwrap(), "0123456789A");
        let link = dir.path().join("zero.yaml");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert_eq!(read_bounded(&link, 10), Err(ReadError::NotAFile));
        assert_eq!(read_bounded_from(std::io::repeat(b'x'), 100), Err(ReadError::TooLarge { limit: 100 }));
        assert_eq!(read_bounded_from(&b"\xff"[..], 100), Err(ReadError::NotUtf8 { at: 0 }));
    }
}
