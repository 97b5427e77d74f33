//! The `fabric` binary: a thin shell over the library's [`fabric::runtime::Runtime`] facade.
//! Argument parsing, printing, exit codes and the terminal live here; so do the benchmark driver
//! and the demo tool server, which start processes and read `/proc` (the library never does).

mod bench;
mod cli;
mod progress;
mod serve;
mod toolserver;

fn main() -> std::process::ExitCode {
    cli::main()
}
