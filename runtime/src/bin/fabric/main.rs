//! The `fabric` binary: a thin shell over the library's [`fabric::runtime::Runtime`] facade.
//! Argument parsing, printing, exit codes and the terminal live here; so does the demo tool
//! server. `fabric bench` hands over to the `fabric-bench` program (`bench/`), which starts
//! processes and reads `/proc` (the library never does).

mod cli;
mod eval;
mod forward;
mod progress;
mod serve;
mod streamed;
mod term;
mod toolserver;

/// mimalloc rather than the system allocator: a run allocates many small, short-lived strings
/// and maps, and glibc's malloc/free was a third of the instructions of a staged run
/// (`docs/performance.md`, issue 14). Built without transparent huge pages (`no_thp`): with
/// them, the service's peak RSS grew by half. The library leaves the choice to the program
/// embedding it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
