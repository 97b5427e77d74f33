//! End-to-end tests: the catalogue, hydration, runs and the `fabric` CLI, on fixture files.

mod catalogue;
mod cli;
mod hydrate;
mod llama;
mod parity;
mod providers;
mod run;
mod support;
mod telemetry;
