//! End-to-end tests: the catalogue, hydration, runs and the `fabric` CLI, on fixture files.

mod architecture;
mod browser;
mod catalogue;
mod cli;
mod decision_loop;
mod durable;
mod durable_load;
mod events;
mod faults;
mod hostile;
mod hydrate;
mod idempotency;
mod layers;
mod llama;
mod newcomer;
mod parity;
mod prompts;
mod providers;
mod run;
mod service;
mod skip;
mod store;
mod support;
mod telemetry;
mod webdriver;
mod wire;
