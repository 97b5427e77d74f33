//! End-to-end tests: the catalogue, hydration, runs and the `fabric` CLI, on fixture files.

mod agent;
mod architecture;
mod catalogue;
mod cli;
mod hostile;
mod hydrate;
mod llama;
mod parity;
mod providers;
mod run;
mod support;
mod telemetry;
