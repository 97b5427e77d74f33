//! The binary's two ways out to the terminal, below every command module: lines on stderr
//! ([`say`]) and text on stdout ([`print_out`]).

use std::io::Write;

/// Writes a line to stderr; a closed or full stderr is ignored (there is nowhere left to say it).
pub fn say(line: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Writes to stdout and flushes; a failure (closed pipe, full disk) is returned, never a panic.
pub fn print_out(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}
