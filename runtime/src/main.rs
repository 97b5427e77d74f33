//! The `fabric` binary: a thin shell over [`fabric::cli`].

fn main() -> std::process::ExitCode {
    fabric::cli::main()
}
