//! `fabric bench`: hands the process over to `fabric-bench` (the benchmark driver, a crate of
//! its own so that the shipped binary carries no valgrind or wrk code), with the same arguments.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::term::say;

/// Execs `fabric-bench ARGS...`: the one beside this executable (where cargo and an install put
/// it), else the one on PATH. Returns only when neither can be run. `FABRIC_BIN` tells the driver
/// which `fabric` serves its tool server and services: this one, unless already set.
pub fn bench(args: &[OsString]) -> ExitCode {
    let me = std::env::current_exe().ok();
    let beside = me.as_ref().map(|me| me.with_file_name(format!("fabric-bench{}", std::env::consts::EXE_SUFFIX)));
    let program = beside.clone().filter(|b| b.is_file()).unwrap_or_else(|| PathBuf::from("fabric-bench"));
    let mut cmd = std::process::Command::new(&program);
    cmd.args(args);
    if let Some(me) = &me
        && std::env::var_os("FABRIC_BIN").is_none_or(|b| b.is_empty())
    {
        cmd.env("FABRIC_BIN", me);
    }
    // `exec` returns only on failure.
    let e = cmd.exec();
    if e.kind() == std::io::ErrorKind::NotFound {
        let looked = beside.map(|b| format!("{} or ", b.display())).unwrap_or_default();
        say(format_args!(
            "fabric: bench: `fabric-bench` is not installed (looked for {looked}fabric-bench on PATH); build it with `cargo build --release -p fabric-bench`"
        ));
    } else {
        say(format_args!("fabric: bench: cannot run {}: {e}", program.display()));
    }
    ExitCode::from(2)
}
