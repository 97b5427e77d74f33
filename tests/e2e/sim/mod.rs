//! The seeded simulation (issue 25): random worlds (catalogue, goals, replies) under random
//! provider, tool, store, process and user faults, one seed driving all of it, with the
//! invariants checked after every seed. `FABRIC_SIM_SEED=N` replays one seed (and prints its
//! trace); `FABRIC_SIM_SEEDS=A..B` runs a range (default: the CI range below). See
//! docs/testing.md.
//!
//! A module of the one integration binary (`cargo test --test e2e sim::`): each seed's
//! processes run on a paused clock, but a clock of their own (a current-thread runtime built
//! per seed, `run.rs`), and the simulation sets nothing process-wide, so nothing keeps it in a
//! binary of its own, which would link the library once more.

mod check;
mod faults;
mod model;
mod run;
mod store;
mod tools;
mod trace;
mod world;

use std::collections::BTreeSet;

/// The seeds CI runs, on SQLite and on PostgreSQL.
const CI_SEEDS: std::ops::Range<u64> = 1..1001;
const CI_SEEDS_POSTGRES: std::ops::Range<u64> = 1..101;

fn seeds(default: std::ops::Range<u64>) -> Vec<u64> {
    if let Ok(one) = std::env::var("FABRIC_SIM_SEED") {
        return vec![one.trim().parse().expect("FABRIC_SIM_SEED is a whole number")];
    }
    match std::env::var("FABRIC_SIM_SEEDS") {
        Ok(range) => {
            let (a, b) = range.split_once("..").expect("FABRIC_SIM_SEEDS is A..B");
            let (a, b): (u64, u64) = (a.trim().parse().expect("A of A..B"), b.trim().parse().expect("B of A..B"));
            (a..b).collect()
        }
        Err(_) => default.collect(),
    }
}

/// Leaves out the injected faults one at a time, keeping each omission after which the seed
/// still fails, until none can go: the smallest plan that still shows a violation.
fn shrink(seed: u64, db: &run::Db, first: run::Outcome) -> (BTreeSet<String>, run::Outcome) {
    let mut disabled = BTreeSet::new();
    let mut best = first;
    loop {
        let mut smaller = false;
        let ids: Vec<String> = best.injected.iter().map(|f| f.split(' ').next().unwrap_or_default().to_owned()).collect();
        for id in ids {
            let mut trial = disabled.clone();
            trial.insert(id);
            let outcome = run::run(&run::Seed { seed, disabled: &trial, db });
            if !outcome.violations.is_empty() {
                disabled = trial;
                best = outcome;
                smaller = true;
                break;
            }
        }
        if !smaller {
            return (disabled, best);
        }
    }
}

/// Runs `seeds` on `db`; panics with the first failing seed, its shrunk fault plan and trace.
fn run_seeds(seeds: &[u64], db: &run::Db) {
    let one = seeds.len() == 1;
    let started = std::time::Instant::now();
    let none = BTreeSet::new();
    let mut seen = run::Stats::default();
    for seed in seeds.iter().copied() {
        let outcome = run::run(&run::Seed { seed, disabled: &none, db });
        if one {
            eprintln!("{}", outcome.trace.join("\n"));
        }
        seen.add(&outcome.trace);
        if outcome.violations.is_empty() {
            continue;
        }
        let (left_out, small) = shrink(seed, db, outcome);
        panic!(
            "seed {seed} breaks an invariant on {db:?} (replay it: FABRIC_SIM_SEED={seed} cargo test -p fabric-runtime --test e2e sim::every_seed)\n\
             violations:\n  {}\nfault plan (shrunk; {} fault(s) left out):\n  {}\ntrace:\n  {}\nthe world:\n{}",
            small.violations.join("\n  "),
            left_out.len(),
            small.injected.join("\n  "),
            small.trace.join("\n  "),
            small.files
        );
    }
    eprintln!("{} seed(s) on {db:?} in {:.1} s; {seen}", seeds.len(), started.elapsed().as_secs_f64());
}

/// Seeds that found a bug, each kept (whatever range runs) with what it found:
/// - 35: a segment that lost its lease and the one that took the run over shared a group
///   commit, and the stale one's rows were written (`store::queue`, fixed; its unit test is
///   `a_stale_holder_and_the_new_one_never_share_a_transaction`).
const FOUND: &[u64] = &[35];

#[test]
fn the_seeds_that_found_bugs_still_pass() {
    run_seeds(FOUND, &run::Db::Sqlite);
}

#[test]
fn every_seed_keeps_every_invariant() {
    run_seeds(&seeds(CI_SEEDS), &run::Db::Sqlite);
}

#[test]
fn every_seed_keeps_every_invariant_on_postgres() {
    let url = std::env::var("FABRIC_TEST_POSTGRES_URL").ok().filter(|u| !u.trim().is_empty());
    if crate::skip::skip_unless(url.is_some(), "PostgreSQL", "FABRIC_TEST_POSTGRES_URL is unset (`eval \"$(.ci/postgres start)\"` sets it; .ci/run does)") {
        return;
    }
    run_seeds(&seeds(CI_SEEDS_POSTGRES), &run::Db::Postgres(url.unwrap_or_default()));
}

#[test]
fn a_seed_gives_the_same_trace_twice() {
    let none = BTreeSet::new();
    for seed in [7, 42] {
        let a = run::run(&run::Seed { seed, disabled: &none, db: &run::Db::Sqlite });
        let b = run::run(&run::Seed { seed, disabled: &none, db: &run::Db::Sqlite });
        assert!(a.trace.len() > 10, "seed {seed} did little: {:?}", a.trace);
        if a.trace != b.trace {
            let at = a.trace.iter().zip(&b.trace).position(|(x, y)| x != y).unwrap_or(a.trace.len().min(b.trace.len()));
            panic!("seed {seed}: the traces differ from line {at}:\n  {:?}\n  {:?}", a.trace.get(at), b.trace.get(at));
        }
    }
}
